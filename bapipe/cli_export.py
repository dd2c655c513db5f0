"""`bapipe export MODEL -o model.onnx`: write a zoo or YAML model as ONNX (docs/onnx.md)."""
from __future__ import annotations

from .onnx_export import export_onnx
from .models import load_model


def cmd_export(args) -> dict:
    """Export ``args.model`` to ``args.output``; returns the export summary (the --json object)."""
    model = load_model(args.model)
    return export_onnx(model, args.output, weights=getattr(args, "weights", "random"), seed=getattr(args, "seed", 0))


def show_export(result: dict) -> str:
    """One human line per fact of the export."""
    ext = f" (weights in {result['external_data']})" if result["external_data"] else ""
    return (f"wrote {result['path']}: {result['model']}, {result['nodes']} nodes, {result['initializers']} "
            f"initializers, {result['weight_bytes'] / 2**20:.1f} MiB of {result['weights']} fp32 weights, "
            f"opset {result['opset']}{ext}")
