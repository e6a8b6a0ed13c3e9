"""Lesson 17 checks of ``load_pretrained_weights``: a pretraining weights file into a fresh model, exactly.

The files are written here, from a tiny model whose weights differ from a fresh one's: as lesson 14's stage
assembly saves them (``model.state_dict()``, fp32) and as upstream's ``train_pretrain.py`` does (every entry
``.half()``: ``save_weights_like_upstream``), with its keys in another order, then with a key left out, one added,
every key renamed by ``torch.compile``, as lesson 15's resume checkpoint, for a wider model, and with one tensor of
another shape: more rows, more columns (as many rows), transposed (as many elements). Loading copies values:
compared bit for bit (an fp16 value is exact in fp32; into a bf16 model each value is the file's cast to bf16).
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch

from course.minimind.sft import save_weights_like_upstream
from course.runs import SESSION_SCENARIO, params_of, session_model, tiny_model
from course.runs.eager import eager

from ..framework import check, expect_equal, expect_raises, fail
from ..lesson16.checks import rule


def pretrained_model() -> torch.nn.Module:
    """The tiny model after a (pretend) pretraining: every weight moved by a seeded amount, so that no value of a
    fresh model equals the file's."""
    model = session_model()
    generator = torch.Generator().manual_seed(17)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


RESHAPED = "model.layers.0.mlp.up_proj.weight"   # 128 x 32: given another shape in some files


@contextlib.contextmanager
def weights_files():
    """``{kind: path}`` of the files a check loads, in a temporary directory."""
    model = pretrained_model()
    state = model.state_dict()
    wider = tiny_model(SESSION_SCENARIO.with_(hidden_size=48)).state_dict()
    rows, columns = state[RESHAPED].shape
    contents = {
        "fp32": state,
        "reordered": dict(reversed(state.items())),
        "missing": {k: v for k, v in state.items() if k != "model.norm.weight"},
        "unexpected": {**state, "lm_head.bias": torch.zeros(state["lm_head.weight"].shape[0])},
        "compiled": {f"_orig_mod.{k}": v for k, v in state.items()},
        "resume": {"model": state, "optimizer": eager(torch.optim.AdamW)(model.parameters()).state_dict(),
                   "scaler": None, "epoch": 0, "step": 8, "world_size": 1},
        "wider": wider,
        "more_rows": {**state, RESHAPED: torch.zeros(rows + 8, columns)},
        "more_columns": {**state, RESHAPED: torch.zeros(rows, columns + 8)},   # its first dimension the model's
        "transposed": {**state, RESHAPED: state[RESHAPED].t().contiguous()},   # its element count the model's
    }
    with tempfile.TemporaryDirectory(prefix="lesson17-weights-") as folder:
        paths = {kind: Path(folder) / f"{kind}.pth" for kind in (*contents, "fp16")}
        for kind, content in contents.items():
            torch.save(content, paths[kind])
        save_weights_like_upstream(model, paths["fp16"])
        yield paths


def load_hint(model, params_before: list, dtype: torch.dtype) -> str:
    """Why a loaded model is not the file's: its parameters replaced, its dtype changed, or values off."""
    if [id(p) for p in model.parameters()] != [id(p) for p in params_before]:
        return ("the model's parameters were replaced, not written into (assign=True, or a new model): an optimizer "
                "built on them would train tensors the model no longer uses; load in place")
    if any(p.dtype != dtype for p in model.parameters()):
        return (f"the model changed its dtype ({next(p.dtype for p in model.parameters() if p.dtype != dtype)}, not "
                f"its own {dtype}): the file's values are cast to the model's dtype (fp16 -> fp32 is exact), the "
                "model is never cast")
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        return "lm_head.weight is tied to the embedding: load both into the model's own tensors"
    return ("every entry of the file goes into the model's tensor of the same name, value for value, whatever the "
            "order of the file's keys")


# (what is loaded, the file's kind, the model's dtype)
LOADS = (("lesson 14's fp32 file", "fp32", torch.float32), ("upstream's fp16 file", "fp16", torch.float32),
         ("an fp32 file, its keys in reverse order", "reordered", torch.float32),
         ("lesson 14's fp32 file", "fp32", torch.bfloat16))


@check("load_pretrained_weights", objective="pretrained_weights")
def loads_a_weights_file_exactly(impl):
    """A weights file saved as lesson 14's stage saves it (fp32), as upstream saves it (fp16) and with its keys in
    another order loads into a fresh tiny model in place: its parameters (the same objects, the embedding still
    tied to lm_head, still at the model's dtype: fp32, and bf16 for a bf16 model) hold the file's values cast to
    that dtype; it returns the file's state dict as read."""
    with weights_files() as paths:
        for what, kind, dtype in LOADS:
            file = torch.load(paths[kind], weights_only=True)
            model = session_model().to(dtype)
            params_before = list(model.parameters())
            try:
                returned = impl.load_pretrained_weights(model, paths[kind])
            except NotImplementedError:
                raise
            except Exception as exc:
                fail(f"load_pretrained_weights(fresh {dtype} model, {what})", f"{type(exc).__name__}: {exc}",
                     "the file loaded", "hint: the rule: a weights file of the model's own keys and shapes loads, "
                     "whatever the order of its keys and the dtype of its values: each entry into the model's tensor "
                     "of the same name")
            hint = load_hint(model, params_before, dtype)
            for name, value in model.state_dict().items():
                if value.dtype != dtype or not torch.equal(value, file[name].to(dtype)):
                    fail(f"load_pretrained_weights(fresh {dtype} model, {what}): {name} after loading "
                         f"(dtype {value.dtype})", value.flatten()[:4].tolist(),
                         file[name].to(dtype).flatten()[:4].tolist(), f"hint: the rule: {hint}")
            if [id(p) for p in model.parameters()] != [id(p) for p in params_before] or \
                    model.lm_head.weight is not model.model.embed_tokens.weight:
                fail(f"load_pretrained_weights(fresh {dtype} model, {what}): the model's parameters afterwards",
                     "other objects, or lm_head untied", "the same objects, lm_head tied to the embedding",
                     f"hint: the rule: {hint}")
            as_read = isinstance(returned, dict) and sorted(returned) == sorted(file) and all(
                isinstance(returned[k], torch.Tensor) and returned[k].dtype == v.dtype and torch.equal(returned[k], v)
                for k, v in file.items())
            if not as_read:
                fail(f"load_pretrained_weights(fresh {dtype} model, {what}): what it returns",
                     f"{type(returned).__name__} {sorted(returned)[:3] if isinstance(returned, dict) else returned}",
                     f"dict, the file's {len(file)} entries as read ({file['model.norm.weight'].dtype})",
                     "hint: the rule: return the file's state dict as read (its keys, its dtype)")


# (what, file kind, a key the error must name, or None: any of the model's or the file's keys)
MISFITS = (("a file without model.norm.weight", "missing", "model.norm.weight"),
           ("a file with an extra lm_head.bias", "unexpected", "lm_head.bias"),
           ("a file saved through torch.compile (every key prefixed _orig_mod.)", "compiled", None),
           ("lesson 15's resume checkpoint (model, optimizer, scaler, epoch, step, world_size)", "resume", None),
           ("the weights of a wider model (hidden size 48)", "wider", None),
           (f"a file whose {RESHAPED} has 8 more rows", "more_rows", RESHAPED),
           (f"a file whose {RESHAPED} has 8 more columns (as many rows as the model's)", "more_columns", RESHAPED),
           (f"a file whose {RESHAPED} is transposed (as many elements as the model's)", "transposed", RESHAPED))


@check("load_pretrained_weights", objective="pretrained_weights")
def refuses_a_file_that_does_not_fit(impl):
    """A file that is not the model's weights is refused with an error naming a key, and the model stays as it
    was, every parameter bit for bit: a key missing (upstream's strict=False loads the rest and says nothing), an
    extra key, every key prefixed by torch.compile, a resume checkpoint, a wider model's shapes, one tensor of
    another shape: more rows, more columns, transposed (a shape is compared whole, not by its first dimension or
    its element count)."""
    with weights_files() as paths:
        keys = {*session_model().state_dict(),
                *(k for _, kind, key in MISFITS if key is None for k in torch.load(paths[kind], weights_only=True))}
        for what, kind, key in MISFITS:
            model = session_model()
            before = params_of(model)
            try:
                impl.load_pretrained_weights(model, paths[kind])
            except NotImplementedError:
                raise
            except Exception as exc:
                named = [k for k in keys if k in str(exc)] if key is None else [key] * (key in str(exc))
                if not named:
                    fail(f"load_pretrained_weights(model, {what}): the error names no key", str(exc)[:300],
                         key or "an error naming a key of the model or of the file",
                         "hint: the rule: name the key that does not fit (missing, unexpected, another shape)")
            else:
                fail(f"load_pretrained_weights(model, {what})", "loaded without an error", "an error naming the key",
                     "hint: the rule: every key is accounted for: a key the model has and the file lacks, a key the "
                     "file has and the model lacks, a tensor of another shape are each refused (strict=False hides "
                     "the first two)")
            changed = sorted(n for n, p in model.named_parameters() if not torch.equal(p, before[n]))
            if changed:
                fail(f"load_pretrained_weights(model, {what}) refused the file, but the model changed",
                     f"{len(changed)} parameters changed, e.g. {changed[:2]}", "no parameter changed",
                     "hint: the rule: refuse before the model changes: compare every key and each whole shape "
                     "first (torch.Size equality: a transposed tensor has the model's element count, one with more "
                     "columns its first dimension; load_state_dict(strict=True) raises only after copying whatever "
                     "fits)")


@check("load_pretrained_weights")
def load_refusal_is_a_value_error_naming_every_key(impl):
    """A file with two keys missing and one unexpected is a ValueError that names all three; an entry that is not
    a tensor is a ValueError naming it (not an AttributeError on .shape)."""
    state = pretrained_model().state_dict()
    bad = {k: v for k, v in state.items() if k not in ("model.norm.weight", "lm_head.weight")}
    cases = (("two keys missing, one unexpected", {**bad, "extra.weight": torch.zeros(1)},
              ("model.norm.weight", "lm_head.weight", "extra.weight")),
             ("model.norm.weight holding a list", {**state, "model.norm.weight": [1.0] * 32}, ("model.norm.weight",)))
    with tempfile.TemporaryDirectory(prefix="lesson17-weights-") as folder:
        for what, content, names in cases:
            path = Path(folder) / "bad.pth"
            torch.save(content, path)
            for name in names:
                expect_raises(f"load_pretrained_weights(model, {what})",
                              lambda: impl.load_pretrained_weights(session_model(), path), ValueError, name)


@check("load_pretrained_weights")
def load_names_a_bad_path(impl):
    """A path that does not exist, a file torch.load cannot read and a file holding no dict are refused with an
    error naming the path: a ValueError (read_state_dict's InputError is one), or a FileNotFoundError for the
    missing one."""
    with tempfile.TemporaryDirectory(prefix="lesson17-weights-") as folder:
        garbage, listed = Path(folder) / "garbage.pth", Path(folder) / "list.pth"
        garbage.write_bytes(b"not a checkpoint")
        torch.save([1, 2, 3], listed)
        for what, path, error in (("a missing file", Path(folder) / "missing.pth", (ValueError, FileNotFoundError)),
                                  ("a file that is no checkpoint", garbage, ValueError),
                                  ("a file holding a list", listed, ValueError)):
            try:
                impl.load_pretrained_weights(session_model(), path)
            except NotImplementedError:
                raise
            except error as exc:
                expect_equal(f"load_pretrained_weights(model, {what}): the error names the path", str(path) in str(exc),
                             True)
            except Exception as exc:
                fail(f"load_pretrained_weights(model, {what})", f"{type(exc).__name__}: {exc}",
                     f"a ValueError naming {str(path)!r}")
            else:
                fail(f"load_pretrained_weights(model, {what})", "no error", "a ValueError naming the path")


CALLS = []   # what record_call received: a file that names it runs it when unpickled without weights_only


def record_call(*args) -> None:
    CALLS.append(args)


class RunsCode:
    """Pickled as a call of ``record_call``: loading it without ``weights_only`` runs that call."""

    def __reduce__(self):
        return record_call, ("code from a weights file ran",)


@check("load_pretrained_weights")
def load_never_runs_code(impl):
    """A file that would call a function when unpickled is refused without running it (weights_only=True)."""
    CALLS.clear()
    with tempfile.TemporaryDirectory(prefix="lesson17-weights-") as folder:
        path = Path(folder) / "code.pth"
        torch.save({"model.norm.weight": RunsCode()}, path)
        try:
            impl.load_pretrained_weights(session_model(), path)
        except NotImplementedError:
            raise
        except Exception:   # refusing the file is right; whether it ran the call is the verdict
            pass
    expect_equal("functions the file called while it was loaded", CALLS, [])


@check("load_pretrained_weights")
def loads_into_the_models_own_storage(impl):
    """The convention (lesson 17 §5.5): the values are copied into the storage the model's tensors already have,
    as load_state_dict does (copy_ under no_grad); rebinding ``param.data`` to the file's tensor keeps the Parameter
    objects but swaps their storage behind autograd's back, and anything holding a view of the old one keeps the
    random values."""
    with weights_files() as paths:
        model = session_model()
        storage = {name: tensor.data_ptr() for name, tensor in model.state_dict().items()}
        impl.load_pretrained_weights(model, paths["fp16"])
        moved = [name for name, tensor in model.state_dict().items() if tensor.data_ptr() != storage[name]]
        with rule("copy the file's values into the model's own tensors (tensor.copy_, what load_state_dict does), "
                  "do not rebind param.data to new tensors"):
            expect_equal("state_dict entries whose storage changed while loading", moved, [])
