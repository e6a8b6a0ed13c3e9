"""Mutants of the lesson-15 reference that no check can fail, each with why (``python -m course mutants 15``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
    "SkipBatchSampler.__init__#1: arithmetic // -> /":
        "total is only compared with the int skip_batches, and skip <= x holds exactly when skip <= floor(x)",
    "SkipBatchSampler.__init__#1: statements swapped with the next one":
        "two independent attribute assignments (indices, batch_size) in either order",
    "SkipBatchSampler.__init__#2: statements swapped with the next one":
        "two independent attribute assignments (batch_size, skip_batches) in either order",
    "SkipBatchSampler.__iter__#1: statements swapped with the next one":
        "skipped_samples and the empty batch list are independent initialisations",
    "save_checkpoint#1: statements swapped with the next one":
        "path = Path(path) and unwrapping the model are independent",
    "save_checkpoint#3: statements swapped with the next one":
        "adding the extras to the dict and creating the parent directory are independent",
    "save_checkpoint#3: constant True -> False":
        "the except branch runs only while the temporary file exists (mkstemp made it; only os.replace, the "
        "try's last call, removes it)",
    "save_checkpoint#5: statements swapped with the next one":
        "torch.save flushes the file object it writes to before returning: flush before or after it is the same",
    "save_checkpoint#5: statement removed (Expr)":
        "torch.save flushes the file object it writes to before returning (the fsync check sees every byte "
        "without handle.flush()); the explicit flush states the order for any other writer",
    "save_checkpoint#6: statements swapped with the next one":
        "torch.save already flushed the file object, so flushing after os.fsync changes nothing on disk",
    "_validate_optimizer_state#1: call: first two arguments swapped":
        "the zipped groups are compared by set(saved_group) != set(group), which is symmetric",
    "_validate_optimizer_state#1: statements swapped with the next one":
        "the parameter list and the saved ids are computed independently",
    "_validate_model_state#1: call: first two arguments swapped":
        "saved_config.get(ABSENT, k) lists every field as differing: the message still names the one that "
        "differs, and a message naming more fields (both configs whole) is right by design",
    "_validate_model_state#2: call: first two arguments swapped":
        "config.get(ABSENT, k) lists every field as differing: the message still names the one that differs, "
        "and a message naming more fields (both configs whole) is right by design",
}
