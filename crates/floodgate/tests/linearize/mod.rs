//! Linearizability by brute force, for the loom models: racing operations are correct
//! when some sequential order of them, applied to the exact model, gives exactly the
//! results observed.

/// True if some order of `ops` applied to a copy of `model` makes operation `i` return
/// `observed[i]` for every `i`.
pub fn some_order_matches<M: Clone, O, R: PartialEq>(
    model: &M,
    ops: &[O],
    observed: &[R],
    apply: impl Fn(&mut M, &O) -> R,
) -> bool {
    fn search<M: Clone, O, R: PartialEq>(
        model: &M,
        ops: &[O],
        observed: &[R],
        done: &mut Vec<bool>,
        apply: &impl Fn(&mut M, &O) -> R,
    ) -> bool {
        if done.iter().all(|&d| d) {
            return true;
        }
        for i in 0..ops.len() {
            if done[i] {
                continue;
            }
            let mut next = model.clone();
            if apply(&mut next, &ops[i]) != observed[i] {
                continue;
            }
            done[i] = true;
            let found = search(&next, ops, observed, done, apply);
            done[i] = false;
            if found {
                return true;
            }
        }
        false
    }
    search(model, ops, observed, &mut vec![false; ops.len()], &apply)
}
