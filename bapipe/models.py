"""Loading a model by name or file: the zoo's models, model YAML files and ONNX graphs, one
front door over bapipe.zoo, bapipe.spec and bapipe.onnx_import."""
from __future__ import annotations

from pathlib import Path

from . import zoo
from .errors import SpecError
from .spec import Model, parse_model
from .yamlio import load_file


def load_model(name_or_path: str, opaque: dict[str, tuple[float, float]] | None = None) -> Model:
    """A zoo model by name, or a model file (.yaml/.yml/.onnx); ``opaque``: ONNX op -> (fwd_s, bwd_s)."""
    if name_or_path in zoo.ZOO:
        return zoo.get(name_or_path)
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return parse_model(load_file(p), str(p), str(p))
    if p.suffix == ".onnx":
        try:
            from .onnx_import import load_onnx   # onnx is imported only for .onnx files
        except ImportError:
            raise SpecError(str(p), None, None, "ONNX import is not available in this build") from None
        return load_onnx(str(p), opaque)
    raise SpecError(name_or_path, None, "MODEL",
                    f"expected a zoo model ({', '.join(zoo.ZOO)}) or a .yaml/.onnx file")
