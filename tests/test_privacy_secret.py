"""CFL's privacy transform from a secret file the clients hold (`clusterfed secret new`)."""

from __future__ import annotations

import stat

import numpy as np
import pytest
from helpers import cli, comparable, tiny_config

from clusterfed.client import secret
from clusterfed.client.privacy import ParameterTransform
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import Simulation, privacy_transform


def test_secret_new_writes_32_private_bytes_and_never_overwrites(tmp_path, capsys):
    path = tmp_path / "federation.secret"
    code, out, err = cli(capsys, "secret", "new", str(path))
    assert code == 0, err
    data = path.read_bytes()
    assert len(data) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret.secret_id(data) in out       # the id sites compare out of band
    assert data.hex() not in out               # never the secret itself
    code, _, err = cli(capsys, "secret", "new", str(path))
    assert code == 2 and "exists" in err
    assert path.read_bytes() == data
    other = tmp_path / "other.secret"
    cli(capsys, "secret", "new", str(other))
    assert other.read_bytes() != data


def test_the_same_file_gives_the_same_transform_and_another_file_another(tmp_path):
    a, b = secret.new_secret_file(tmp_path / "a"), secret.new_secret_file(tmp_path / "b")
    copy = tmp_path / "copy-of-a"
    copy.write_bytes(a.read_bytes())
    first = ParameterTransform.from_secret("permutation", secret.read_secret_file(a), 500)
    again = ParameterTransform.from_secret("permutation", secret.read_secret_file(copy), 500)
    other = ParameterTransform.from_secret("permutation", secret.read_secret_file(b), 500)
    np.testing.assert_array_equal(first.perm, again.perm)
    assert not np.array_equal(first.perm, other.perm)
    assert sorted(first.perm) == list(range(500))
    signed = ParameterTransform.from_secret("signed_permutation", a.read_bytes(), 500)
    assert signed.signs is not None and set(np.unique(signed.signs)) == {-1.0, 1.0}
    # Not the seed-derived transform of any small seed: the hash of the bytes seeds it.
    assert not np.array_equal(first.perm, ParameterTransform.from_seed("permutation", 0,
                                                                       500).perm)


def test_a_short_or_missing_secret_file_is_refused(tmp_path):
    short = tmp_path / "short"
    short.write_bytes(b"password")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        secret.read_secret_file(short)
    with pytest.raises(ConfigError, match="does not exist"):
        secret.read_secret_file(tmp_path / "missing")


def test_run_privacy_secret_file_is_the_transform_of_that_file(tmp_path):
    path = secret.new_secret_file(tmp_path / "s")
    config = tiny_config("fedavg", run={"privacy": "permutation",
                                        "privacy_secret_file": str(path)})
    transform = privacy_transform(config, 300)
    expected = ParameterTransform.from_secret("permutation", path.read_bytes(), 300)
    np.testing.assert_array_equal(transform.perm, expected.perm)
    both = tiny_config("fedavg", run={"privacy": "permutation", "privacy_seed": 3,
                                      "privacy_secret_file": str(path)})
    with pytest.raises(ConfigError, match="privacy_seed"):
        privacy_transform(both, 300)


@pytest.mark.parametrize("name", ["fedavg", "ifca"])
def test_a_run_with_a_secret_file_equals_the_run_without_privacy(name, tmp_path):
    # IFCA draws further initial models (draw_initial): each must be P-mapped by the same file.
    path = secret.new_secret_file(tmp_path / "s")
    plain = tiny_config(name)
    private = tiny_config(name, run={"privacy": "permutation", "privacy_secret_file": str(path)})
    if name == "ifca":
        plain["algorithm"]["k"] = private["algorithm"]["k"] = 2
    sim = Simulation(private)
    assert comparable(Simulation(plain).run()) == comparable(sim.run())
    transform = ParameterTransform.from_secret("permutation", path.read_bytes(), sim.model.size)
    np.testing.assert_array_equal(sim.setup.initial_params,
                                  transform.forward(sim.model.initial_vector().numpy()))
    if name == "ifca":
        draw = sim.setup.draw_initial(1)
        assert not np.array_equal(draw, sim.setup.initial_params)
        plain_draw = Simulation(plain).setup.draw_initial(1)
        np.testing.assert_array_equal(transform.inverse(draw), plain_draw)
