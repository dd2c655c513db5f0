"""Checkpoints: weights, buffers and optimizer state of every layer in one .npz file.

Arrays are keyed by layer name, not by stage (``p/<layer>/<name>``, ``b/...`` buffers,
``o/<slot>/<layer>/<name>`` optimizer slots, ``s/...`` 2BW shadow weights), so a
checkpoint can be resumed under another partition of the same model. ``meta`` holds the
position (epoch, iteration in epoch), the optimizer step count, seed and fingerprints.
"""
from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError
from bapipe.plan import Plan


def save(path: str | Path, plan: Plan, state: dict, epoch: int, iteration: int, seed: int) -> None:
    """Write ``state`` (Pipeline.get_state()) at position (epoch, iteration)."""
    arrays: dict[str, np.ndarray] = {}
    steps = 0
    for s in sorted(state):
        st = state[s]
        for l, d in st["params"].items():
            for n, a in d.items():
                arrays[f"p/{l}/{n}"] = a
        for l, d in st["bufs"].items():
            for n, a in d.items():
                arrays[f"b/{l}/{n}"] = a
        for slot, layers in st["opt"]["slots"].items():
            for l, d in layers.items():
                for n, a in d.items():
                    arrays[f"o/{slot}/{l}/{n}"] = a
        if st.get("shadow"):
            for l, d in st["shadow"].items():
                for n, a in d.items():
                    arrays[f"s/{l}/{n}"] = a
        steps = st["opt"]["step_count"]
    meta = {"epoch": epoch, "iteration": iteration, "step_count": steps, "seed": seed, "model": plan.model,
            "model_fingerprint": plan.model_fingerprint, "optimizer": plan.optimizer, "schedule": plan.schedule}
    arrays["meta"] = np.array(json.dumps(meta))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    try:
        np.savez(tmp, **arrays)
        tmp.replace(path)  # atomic: a crash mid-write leaves the previous checkpoint intact
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SpecError(str(path), None, "--checkpoint", f"cannot write the checkpoint: {e.strerror or e}") from None


#: metadata every checkpoint carries (save() writes them)
_META_KEYS = ("epoch", "iteration", "step_count", "seed", "model", "model_fingerprint", "optimizer")


def load(path: str | Path, plan: Plan, model, seed: int | None = None) -> tuple[int, int, dict]:
    """(epoch, iteration, state by stage of ``plan``) from a checkpoint of the same model.

    ``seed`` must match the checkpoint's when given: it fixes the data order being resumed.
    """
    try:
        z = np.load(path, allow_pickle=False)
        meta = json.loads(str(z["meta"]))
        if not isinstance(meta, dict) or not all(k in meta for k in _META_KEYS):
            raise ValueError("no bapipe metadata")
        arrays = {k: np.array(z[k], np.int64 if np.issubdtype(z[k].dtype, np.integer) else np.float32)
                  for k in z.files if k != "meta"}  # reads every member now; raw fixed-point stays int64
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        # a truncated or foreign file is bad input: one line, not a BadZipFile traceback
        raise SpecError(str(path), None, "--resume", f"expected a bapipe checkpoint (.npz): "
                                                     f"{type(e).__name__}: {e}") from None
    if meta["model_fingerprint"] != plan.model_fingerprint:
        raise SpecError(str(path), None, "model_fingerprint",
                        f"checkpoint is of model '{meta['model']}' (another version); expected '{plan.model}'")
    if seed is not None and meta["seed"] != seed:
        raise SpecError(str(path), None, "--seed", f"checkpoint was trained with --seed {meta['seed']}; "
                                                   f"resume with the same seed (data order), got {seed}")
    if meta["optimizer"] != plan.optimizer:
        raise SpecError(str(path), None, "optimizer", f"checkpoint has {meta['optimizer']} state; "
                                                      f"the plan trains with {plan.optimizer}")
    nested: dict[str, dict] = {}
    for k, a in arrays.items():
        parts = k.split("/")
        if len(parts) < 3:
            raise SpecError(str(path), None, "--resume", f"expected a bapipe checkpoint: unknown array '{k}'")
        kind, (l, n) = parts[0], parts[-2:]
        slot = parts[1] if kind == "o" else None
        nested.setdefault((kind, slot), {}).setdefault(l, {})[n] = a
    state = {}
    for st in plan.stages:
        names = set(st.layers)

        def pick(kind, slot=None):
            return {l: d for l, d in nested.get((kind, slot), {}).items() if l in names}

        params = {l: pick("p").get(l, {}) for l in st.layers}
        missing = [l for l in st.layers if model.layers[model.index[l]].params and not params[l]]
        if missing:
            raise SpecError(str(path), None, "weights", f"checkpoint lacks layer '{missing[0]}'")
        slots = {slot: pick("o", slot) for (kind, slot) in nested if kind == "o"}
        shadow = pick("s")
        state[st.index] = {"params": params, "bufs": {l: pick("b").get(l, {}) for l in st.layers},
                           "opt": {"step_count": meta["step_count"], "slots": slots},
                           "shadow": ({l: shadow.get(l, {}) for l in st.layers} if shadow else None)}
    return int(meta["epoch"]), int(meta["iteration"]), state
