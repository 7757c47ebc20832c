// The DFlash step's bookkeeping on the GPU, so that draft, verify, acceptance and KV
// rollback need no host round trip. `state`: [0] committed length = the block's first
// position, [2] the anchor token. `ext_state`: [0] where the drafter's context grows
// next (the previous block start). A deferred one-row step (`keep_context`) leaves it:
// its row joins the rows the next extension adds.

struct Params {
    block: u32,       // B: rows verified this step
    mask: u32,        // the drafter's mask token id
    host_drafts: u32, // 1: take drafts from `host` (tests) instead of the drafter
    keep_context: u32, // 1: commit leaves ext_state (the context extension is deferred)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> ext_state: array<u32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;      // B ids
@group(0) @binding(4) var<storage, read> drafts: array<u32>;         // drafter argmax per row
@group(0) @binding(5) var<storage, read> host: array<u32>;           // drafts given by the host
@group(0) @binding(6) var<storage, read> out: array<u32>;            // target token per row
@group(0) @binding(7) var<storage, read_write> result: array<u32>;   // [acc, tokens...]

// The drafter's input: [anchor, MASK x (B-1)].
@compute @workgroup_size(16)
fn prepare(@builtin(local_invocation_index) t: u32) {
    if (t < p.block) {
        ids[t] = select(p.mask, state[2], t == 0u);
    }
}

// The target's input: [anchor, d1 .. d(B-1)] (drafter row j predicts the token at j).
@compute @workgroup_size(16)
fn compose(@builtin(local_invocation_index) t: u32) {
    if (t < p.block) {
        if (t == 0u) {
            ids[0] = state[2];
        } else if (p.host_drafts == 1u) {
            ids[t] = host[state[0] + t];
        } else {
            ids[t] = drafts[t];
        }
    }
}

// Longest prefix of drafts equal to the target's tokens; commit anchor + accepted drafts,
// the target's next token becomes the bonus and the next anchor. The KV cache rolls back
// by the committed length alone: rows past it are overwritten by the next block.
@compute @workgroup_size(1)
fn accept() {
    var acc = 0u;
    while (acc + 1u < p.block && ids[acc + 1u] == out[acc]) {
        acc += 1u;
    }
    commit(acc, out[acc]);
}

// Commits the anchor and `acc` drafts: the result for the host, the drafter's next
// context rows, the new length and anchor.
fn commit(acc: u32, bonus: u32) {
    result[0] = acc;
    for (var j = 1u; j <= acc; j++) {
        result[j] = ids[j];
    }
    result[acc + 1u] = bonus;
    if (p.keep_context == 0u) {
        ext_state[0] = state[0];
    }
    state[0] = state[0] + acc + 1u;
    state[2] = bonus;
}

// `accept` for rejection-sampling verification: the drafts accepted up to the first
// rejected row; the bonus is that row's residual draw, or, when every draft was
// accepted, the target's own sample of the last row.
@group(0) @binding(8) var<storage, read> verdict: array<u32>;

@compute @workgroup_size(1)
fn accept_rejection() {
    var acc = 0u;
    while (acc + 1u < p.block && verdict[2u * acc] == 1u) {
        acc += 1u;
    }
    commit(acc, select(out[acc], verdict[2u * acc + 1u], acc + 1u < p.block));
}
