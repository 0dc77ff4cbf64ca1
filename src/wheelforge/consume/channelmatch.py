"""The channel for a venv that already holds torch (``wheelforge install``): the one built
for that torch, so that installing keeps the user's torch instead of replacing it.

A channel is named from the torch and CUDA its wheels were built for (``cu130-torch2.11``,
index/records.channel_name); the venv's torch is read from its ``torch/version.py``
(builder/env/_probe.py ``--torch-version``: torch and its CUDA libraries are not imported).
With no such channel, the error names the command that builds one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..builder.env import buildenv
from ..errors import ConfigError, PublishError, ToolchainError
from ..index.records import channel_name
from .venv import venv_prefix


@dataclass(frozen=True)
class VenvTorch:
    """The torch a venv holds: its version and CUDA (None: a CPU build)."""

    python: Path
    version: str
    cuda: str | None

    @property
    def channel(self) -> str | None:
        """The channel built for this torch (None: a CPU torch, or versions not PEP 440)."""
        if self.cuda is None:
            return None
        try:
            return channel_name(self.cuda, self.version)
        except PublishError:
            return None

    def describe(self) -> str:
        return f"torch {self.version} (CUDA {self.cuda or 'none: a CPU build'}) in {self.python}"


def venv_torch(python: Path) -> VenvTorch | None:
    """The torch of the venv interpreter ``python`` (read, not imported), None without
    one; a ConfigError for an interpreter outside a venv (venv.venv_prefix, asked first)
    or one whose answer is not the probe's."""
    venv_prefix(python)
    try:
        env = buildenv.inspect_env(python, with_torch=False)
        if "torch" not in dict(env.distributions):
            return None
        env = buildenv.inspect_env(python, import_torch=False)
    except (ToolchainError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ConfigError(f"cannot read which torch {python} holds",
                          why=getattr(exc, "what", None) or f"its answer to wheelforge's "
                              f"probe is not the probe's ({type(exc).__name__})",
                          fix="pass --python a working venv's directory or interpreter"
                          ) from None
    if not isinstance(env.torch_cuda, (str, type(None))):
        raise ConfigError(f"cannot read which torch {python} holds",
                          why=f"its torch/version.py says cuda = {env.torch_cuda!r}",
                          fix="reinstall torch in that venv")
    return VenvTorch(python=python, version=str(env.torch_version), cuda=env.torch_cuda)


def choose(known: Sequence[str], torch: VenvTorch, projects: Sequence[str],
           where: str) -> str:
    """The channel of ``known`` built for ``torch``; a ConfigError naming the command that
    builds one when there is none."""
    want = torch.channel
    if want is not None and want in known:
        return want
    build = (f"wheelforge build {' '.join(projects) or 'NAME'} --python {torch.python}")
    raise ConfigError(
        f"{where} has no channel for {torch.describe()}",
        why=(f"its channels are: {', '.join(known) or 'none'}; the wheels for this torch "
             f"would be in {want}" if want else
             f"its channels are CUDA builds ({', '.join(known) or 'none'}) and installing one "
             "would replace this torch"),
        fix=(f"build that channel against this venv's torch ({build}: its wheels are published "
             f"to {want}), then install again; or pass --channel to install another channel, "
             "which replaces the venv's torch" if want else
             "install a CUDA build of torch into the venv first, or pass --channel to install "
             "a channel with its CUDA torch (replacing this one)"))
