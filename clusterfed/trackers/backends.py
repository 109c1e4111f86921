"""One backend a tracker, each through its project's own client library (imported on use,
so a missing optional extra is one line naming it)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from clusterfed.errors import ConfigError

# Tracker name -> (the module it needs, the clusterfed extra that installs it).
NEEDS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"),
         "wandb": ("wandb", "wandb")}


def require(name: str) -> Any:
    """The tracker's library, or a one-line error naming the extra to install."""
    module, extra = NEEDS[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"run.loggers lists {name}, whose library is not installed: "
                          f"pip install 'clusterfed[{extra}]'") from None


class Backend(Protocol):
    """What a run logs to one tracker; `state` is kept in the run folder to continue it."""

    state: dict[str, Any]

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def texts(self, step: int, lines: Sequence[str]) -> None: ...
    def hyperparameters(self, params: Mapping[str, Any], config_text: str) -> None: ...
    def images(self, step: int, paths: Mapping[str, Path]) -> None: ...
    def flush(self) -> None: ...
    def close(self, failed: bool = False) -> None: ...


class TensorBoard:
    """Event files in `logdir` (`tensorboard --logdir` on the experiment's folder compares its
    runs); a resumed run appends to the same folder, its steps continuing."""

    def __init__(self, logdir: Path, experiment: str, name: str, state: Mapping[str, Any]
                 ) -> None:
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(logdir))
        self.state: dict[str, Any] = {"logdir": str(logdir)}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def texts(self, step: int, lines: Sequence[str]) -> None:
        if lines:
            self.writer.add_text("events", "\n\n".join(lines), step)

    def hyperparameters(self, params: Mapping[str, Any], config_text: str) -> None:
        from torch.utils.tensorboard.summary import hparams

        # In this run's own folder (SummaryWriter.add_hparams would open another).
        for summary in hparams(dict(params), {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", f"```\n{config_text}\n```", 0)

    def images(self, step: int, paths: Mapping[str, Path]) -> None:
        import numpy as np
        from PIL import Image

        for name, path in paths.items():
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))
            self.writer.add_image(f"figures/{name}", pixels, step, dataformats="HWC")

    def flush(self) -> None:
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.flush()
        self.writer.close()


class MLflow:
    """A run in the experiment named `experiment` on MLflow's tracking URI
    (MLFLOW_TRACKING_URI); a resumed run continues the run id kept in the run folder."""

    def __init__(self, logdir: Path, experiment: str, name: str, state: Mapping[str, Any]
                 ) -> None:
        mlflow = require("mlflow")
        self.client = mlflow.MlflowClient()
        run_id = state.get("run_id")
        if run_id is None:
            run_id = self.client.create_run(_experiment_id(self.client, experiment),
                                            run_name=name).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.state = {"run_id": run_id}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = _millis()
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        for i in range(0, len(metrics), 1000):   # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def texts(self, step: int, lines: Sequence[str]) -> None:
        if lines:
            self.client.log_text(self.run_id, "\n".join(lines) + "\n",
                                 f"events/round-{step:05d}.txt")
            self.client.set_tag(self.run_id, f"events.round-{step:05d}",
                                "; ".join(lines)[:5000])

    def hyperparameters(self, params: Mapping[str, Any], config_text: str) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        self.client.log_text(self.run_id, config_text, "config.yaml")

    def images(self, step: int, paths: Mapping[str, Path]) -> None:
        for path in paths.values():
            self.client.log_artifact(self.run_id, str(path), "figures")

    def flush(self) -> None:
        """Each call is already stored."""

    def close(self, failed: bool = False) -> None:
        # A run cut off shows as killed until --resume continues the same run id.
        self.client.set_terminated(self.run_id, "KILLED" if failed else "FINISHED")


def _experiment_id(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:   # created meanwhile by a run beside this one (--jobs)
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def _millis() -> int:
    import time

    return int(time.time() * 1000)


class WandB:
    """A W&B run (project: the experiment, grouped by it), its files under `logdir`; a
    resumed run continues the id kept in the run folder (`resume="allow"`). WANDB_MODE
    chooses online or offline."""

    def __init__(self, logdir: Path, experiment: str, name: str, state: Mapping[str, Any]
                 ) -> None:
        wandb = require("wandb")
        self.wandb = wandb
        logdir.mkdir(parents=True, exist_ok=True)
        from wandb.sdk.lib.runid import generate_id

        run_id = state.get("id") or generate_id()
        self.run = wandb.init(project=experiment, group=experiment, name=name, id=run_id,
                              resume="allow", dir=str(logdir), reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))
        self.state = {"id": run_id}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def texts(self, step: int, lines: Sequence[str]) -> None:
        if lines:
            self.run.log({"events": "\n".join(lines)}, step=step)

    def hyperparameters(self, params: Mapping[str, Any], config_text: str) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def images(self, step: int, paths: Mapping[str, Path]) -> None:
        self.run.log({f"figures/{name}": self.wandb.Image(str(path))
                      for name, path in paths.items()}, step=step)

    def flush(self) -> None:
        """W&B's own process holds what was logged."""

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


BACKENDS: dict[str, type] = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": WandB}
