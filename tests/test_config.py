"""Configuration: presets, overrides, and one clear error for every bad input."""

from __future__ import annotations

import pytest

from clusterfed import config as cfg
from clusterfed.errors import ConfigError

pytestmark = pytest.mark.fast


def test_every_preset_resolves():
    assert {"quickstart", "mnist-iid"} <= set(cfg.preset_names())
    for name in cfg.preset_names():
        config = cfg.resolve(name)
        assert set(config) == set(cfg.DEFAULTS)


def test_overrides_parse_yaml_values():
    config = cfg.resolve("quickstart", ["seed=7", "train.lr=0.2", "scenario.clients=12",
                                        "train.participation=0.5", "run.progress=false",
                                        "scenario.pairs=[[1,2],[3,4],[5,6],[7,8]]"])
    assert config["seed"] == 7 and config["train"]["lr"] == 0.2
    assert config["scenario"]["clients"] == 12 and config["run"]["progress"] is False
    assert config["scenario"]["pairs"][3] == [7, 8]


def test_changing_a_kind_drops_the_old_kinds_own_keys():
    base = {"scenario": {"kind": "label_swap", "clients": 20, "clusters": 4,
                         "pairs": [[0, 1], [2, 3], [4, 5], [6, 7]]}}
    config = cfg.resolve(base, ["scenario.kind=rotation"])
    assert "pairs" not in config["scenario"]
    assert config["scenario"]["clients"] == 20 and config["scenario"]["clusters"] == 4


@pytest.mark.parametrize("overrides, message", [
    (["train.lrr=0.1"], r"unknown config key train\.lrr in section 'train'"),
    (["eval.foo=1"], r"unknown config key eval\.foo in section 'eval'"),
    (["trian.lr=0.1"], r"unknown config section 'trian'"),
    (["train.participation=0"], r"participation .* nothing is trained"),
    (["train.participation=-0.5"], r"participation"),
    (["train.participation=2.5"], r"count and must be whole"),
    (["train.rounds=0"], r"train\.rounds must be a positive integer"),
    (["train.batch_size=abc"], r"train\.batch_size must be a positive integer"),
    (["eval.protocol=best"], r"unknown eval\.protocol .best.; valid: cluster, local, best_of_path"),
    (["eval.protocol=best_of_path"], r"set eval\.validation_fraction"),
    (["eval.validation_fraction=1.0"], r"validation_fraction must be in"),
    (["eval.split=train"], r"eval\.split must be one of test, validation, got 'train'"),
    (["eval.split=validation"], r"eval\.split=validation .* set eval\.validation_fraction"),
    (["eval.split=validation", "eval.validation_fraction=0.1", "eval.protocol=best_of_path"],
     r"best_of_path already chooses on the validation data"),
    (["eval.split=validation", "eval.validation_fraction=0.1", "eval.protocol=sampled_local"],
     r"sampled_local weighs clients by their test data"),
    (["seed=one"], r"seed must be an integer"),
    (["train"], r"not of the form key=value"),
    (["train=3"], r"names a section"),
    (["a.b.c=1"], r"unknown config section 'a'"),
    (["train.lr.x=1"], r"cannot set train\.lr\.x: train\.lr is 0\.\d+, not a mapping"),
    (["run.foo.bar=1"], r"unknown config key run\.foo in section 'run'"),
    (["scenario.clients.x=1"],
     r"cannot set scenario\.clients\.x: scenario\.clients is 20, not a mapping"),
    (["scenario..kind=x"], r"empty part"),
    (["scenario.labels=3", "scenario.labels.kind=x"], r"an earlier key set scenario\.labels to 3"),
])
def test_bad_overrides(overrides, message):
    with pytest.raises(ConfigError, match=message):
        cfg.resolve("quickstart", overrides)


def test_nested_overrides_set_one_key_at_any_depth():
    base = {"scenario": {"kind": "rotation", "clients": 8, "clusters": 2,
                         "labels": {"kind": "label_skew", "labels_per_client": 2},
                         "drift": {"round": 5, "clients": 2}}}
    config = cfg.resolve(base, ["scenario.labels.labels_per_client=3",
                                "scenario.drift.to.x.y=1", "algorithm.a.b.c.d=[1, 2]"])
    assert config["scenario"]["labels"] == {"kind": "label_skew", "labels_per_client": 3}
    assert config["scenario"]["drift"] == {"round": 5, "clients": 2, "to": {"x": {"y": 1}}}
    assert config["algorithm"]["a"] == {"b": {"c": {"d": [1, 2]}}}
    assert base["scenario"]["labels"]["labels_per_client"] == 2     # the source is untouched
    # a resolved config is plain YAML again
    assert cfg.resolve(yaml_round_trip(config)) == config


def test_a_nested_kind_change_drops_the_old_kinds_keys_in_any_order():
    base = {"scenario": {"kind": "rotation", "clients": 8, "clusters": 2,
                         "labels": {"kind": "label_skew", "labels_per_client": 2}}}
    for overrides in (["scenario.labels.kind=dirichlet", "scenario.labels.alpha=0.5"],
                      ["scenario.labels.alpha=0.5", "scenario.labels.kind=dirichlet"]):
        config = cfg.resolve(base, overrides)
        assert config["scenario"]["labels"] == {"kind": "dirichlet", "alpha": 0.5}
    same = cfg.resolve(base, ["scenario.labels.kind=label_skew"])
    assert same["scenario"]["labels"] == {"kind": "label_skew", "labels_per_client": 2}


def test_a_nested_override_of_an_unknown_scenario_key_is_one_clear_error():
    from clusterfed.data import build_federation, load_dataset
    config = cfg.resolve("quickstart", ["scenario.kind=rotation", "scenario.clusters=2",
                                        "scenario.labels.kind=dirichlet",
                                        "scenario.labels.alpah=0.5"])
    with pytest.raises(ConfigError, match=r"scenario\.labels.*alpah"):
        build_federation(load_dataset("digits"), config["scenario"], seed=0)


def yaml_round_trip(config):
    import yaml
    return yaml.safe_load(cfg.dump(config))


def test_unknown_preset_lists_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'nope'; valid presets: .*quickstart"):
        cfg.resolve("nope")
    with pytest.raises(ConfigError, match="does not exist"):
        cfg.resolve(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        cfg.resolve(str(bad))
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        cfg.resolve(str(bad))


def test_config_file_round_trips(tmp_path):
    config = cfg.resolve("quickstart", ["seed=5"])
    path = tmp_path / "c.yaml"
    path.write_text(cfg.dump(config))
    assert cfg.resolve(str(path)) == config


def test_kind_independent_scenario_keys_are_the_scenarios_common_keys():
    from clusterfed.data.scenarios import COMMON_KEYS
    assert cfg.KIND_INDEPENDENT["scenario"] == COMMON_KEYS - {"kind"}


def test_changing_the_kind_keeps_common_scenario_options():
    base = {"scenario": {"kind": "label_swap", "clients": 20, "clusters": 4,
                         "samples_per_client": 50, "quantity_skew": 0.5, "pairs": [[0, 1]]}}
    config = cfg.resolve(base, ["scenario.kind=rotation"])
    assert config["scenario"]["samples_per_client"] == 50
    assert config["scenario"]["quantity_skew"] == 0.5 and "pairs" not in config["scenario"]


def test_sweep_keys_reach_any_depth_as_overrides_do():
    from clusterfed.experiments.sweep import patch_of
    base = cfg.resolve({"scenario": {"kind": "rotation", "clients": 8, "clusters": 2,
                                     "labels": {"kind": "dirichlet", "alpha": 1.0}}})
    patched = cfg.merge(base, patch_of({"scenario.labels.alpha": 0.1, "train.lr": 0.2}))
    assert patched["scenario"]["labels"] == {"kind": "dirichlet", "alpha": 0.1}
    assert patched["train"]["lr"] == 0.2
    with pytest.raises(ConfigError, match=r"sweep key 'scenario\.\.alpha' must be a config key"):
        patch_of({"scenario..alpha": 1})


def test_exponent_numbers_are_numbers_in_overrides_files_and_json():
    # PyYAML's YAML 1.1 reads 1e-3 (no dot) as a string; JSON and YAML 1.2 read a number.
    resolved = cfg.resolve("quickstart", ["train.lr=1e-3", "train.adam_eps=1E-08"])
    assert resolved["train"]["lr"] == 1e-3 and resolved["train"]["adam_eps"] == 1e-8
    assert cfg.load_yaml('{"train": {"lr": 1e-08}, "name": "1e-3x"}') == {
        "train": {"lr": 1e-8}, "name": "1e-3x"}
    assert cfg.load_yaml("a: 10\nb: .5e1\nc: '1e-3'") == {"a": 10, "b": 5.0, "c": "1e-3"}
