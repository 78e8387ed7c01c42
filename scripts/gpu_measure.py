"""GPU measurements behind issue 9's goals, run by scripts/gpu_check.sh on a lent H100/H200 (no network).

    python scripts/gpu_measure.py --out runs/gpu-check/measure.json [--head runs/eagle3-smollm2-135m/final]
    python scripts/gpu_measure.py --small --device cpu --out /tmp/m.json      # the plumbing, on a CPU

1. machine: copy bandwidth and bf16 matmul rate (draftsmith.runtime.bench.roofline.machine_rates);
2. plain decode tokens/s of the embedded target and of a random-weight Llama-3.1-8B-shaped model (bf16,
   batch 1, after a warm-up), eager and on the static/CUDA-graph path, interleaved, median of 3, each
   against its memory-bound roofline (goal: >= 75% at 8B shape);
3. verification cost of one forward over n = 1..128 chain tokens at 8B shape, as a multiple of a
   1-token step, eager and as graph replays, with SDPA, draftsmith's tree-attention kernel and (last,
   since it compiles) FlexAttention (goal: 64 nodes <= 1.2x);
4. end to end, if --head is given: plain vs the head (chain and load-aware) on the embedded target
   (draftsmith bench rows; goal: efficiency = speedup / tau >= 0.8);
5. runtime efficiency (speedup / tau) at 8B shape without a head: n-gram and early-exit drafting, eager
   and on CUDA graphs (random weights are fine for this ratio).
Writes one JSON and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

LLAMA_8B = dict(  # Llama-3.1-8B's shape (weights random: speed does not depend on them)
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
)  # fmt: skip
SMOLLM2 = dict(  # the embedded target's shape, for machines that cannot load its weights
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
)  # fmt: skip
SMALL = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=1000, max_position_embeddings=2048,
)  # fmt: skip


class StubTokenizer:
    """What the engine asks of a tokenizer when prompts are token ids already."""

    pad_token_id, eos_token_id, chat_template = 0, None, None


def random_target(shape: dict, device: str, dtype: torch.dtype, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.runtime.core.target import Target

    config = LlamaConfig(**shape, tie_word_embeddings=False)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return Target(model, tokenizer, f"random-llama-{shape['hidden_size']}x{shape['num_hidden_layers']}")


def decode_rates(target, prompt_len: int, new_tokens: int, repeats: int = 3) -> dict:
    """Plain decode tokens/s, eager and static (CUDA graphs), interleaved, median of `repeats`."""
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.verify.sampling import SamplingParams

    ids = torch.randint(0, min(target.vocab_size, 30000), (prompt_len,)).tolist()
    rates: dict[str, list[float]] = {"eager": [], "graphs": []}
    for static in (False, True):  # warm-up, and the graph capture of the session the timed runs reuse
        generate_plain(target, [ids], SamplingParams(), new_tokens, static=static)
    for _ in range(repeats):
        for mode, static in (("eager", False), ("graphs", True)):
            _sync(target.device)
            start = time.perf_counter()
            [res] = generate_plain(target, [ids], SamplingParams(), new_tokens, static=static)
            _sync(target.device)
            rates[mode].append(res.new_tokens / (time.perf_counter() - start))
    return {mode: round(statistics.median(r), 2) for mode, r in rates.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_vs_roofline(target, machine: dict, prompt_len: int, new_tokens: int) -> dict:
    from draftsmith.runtime.bench.roofline import roofline

    rates = decode_rates(target, prompt_len, new_tokens)
    line = roofline(target, machine, 1, prompt_len + new_tokens // 2)
    ceiling = line["memory_bound_tokens_per_s"]
    return {
        "target": target.name,
        "new_tokens": new_tokens,
        "tokens_per_s": rates["eager"],
        "tokens_per_s_graphs": rates["graphs"],
        "roofline": line,
        "share_of_roofline": round(rates["eager"] / ceiling, 3),
        "share_of_roofline_graphs": round(rates["graphs"] / ceiling, 3),
    }


def verify_curve(target, nodes: list[int]) -> dict:
    from draftsmith.runtime.verify.load_aware import measure_verify_costs

    costs = measure_verify_costs(target, [1], max_nodes=max(nodes), context=512, repeats=5)
    ms = costs.seconds[1]
    graphed = graphed_verify_ms(target, nodes, context=512)
    kernel = graphed_verify_with(target, nodes, "triton")
    return {
        "ms": {n: round(1000 * ms[n - 1], 3) for n in nodes},
        "x_one": {n: round(ms[n - 1] / ms[0], 3) for n in nodes},
        "ms_graphs": {n: round(graphed[n], 3) for n in nodes},
        "x_one_graphs": {n: round(graphed[n] / graphed[nodes[0]], 3) for n in nodes},
        "ms_graphs_kernel_attention": kernel,
    }


def graphed_verify_with(target, nodes: list[int], attention: str) -> dict[int, float] | str:
    """The same replays with draftsmith's Triton kernel ("triton") or FlexAttention ("flex") in every
    layer; a failure is recorded as its message, so one backend cannot cost the other measurements."""
    from draftsmith.runtime.core.kernel_attention import use_kernel_attention

    use_kernel_attention(target, attention)
    try:
        return {n: round(ms, 3) for n, ms in graphed_verify_ms(target, nodes, context=512).items()}
    except Exception as err:  # noqa: BLE001 - recorded, not hidden
        return f"{type(err).__name__}: {err}"[:500]
    finally:
        use_kernel_attention(target, False)


@torch.inference_mode()
def graphed_verify_ms(target, nodes: list[int], context: int, repeats: int = 20) -> dict[int, float]:
    """ms per verification forward of n chain tokens after `context` cached tokens, on the static path
    (a graph replay on CUDA): each call rewrites the same slots, so the cache does not grow."""
    from draftsmith.runtime.core.static_forward import GraphedForward, StaticKVCache, static_forward

    device = target.device
    cache = StaticKVCache.for_target(target, 1, context + max(nodes))
    ids = torch.randint(0, min(target.vocab_size, 30000), (1, context), device=device)
    every = torch.ones(1, context, dtype=torch.bool, device=device)
    causal = torch.ones(context, context, dtype=torch.bool, device=device).tril()[None]
    static_forward(target, cache, ids, torch.arange(context, device=device)[None], every,
                   torch.arange(context, device=device), causal)  # fmt: skip
    cache.advance(context)
    forward = GraphedForward(target, cache)
    out = {}
    for n in nodes:
        step = (ids[:, :n], context + torch.arange(n, device=device)[None], every[:, :n], causal[:, :n, :n])
        forward(*step)  # capture
        _sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            forward(*step)
        _sync(device)
        out[n] = 1000 * (time.perf_counter() - start) / repeats
    return out


def end_to_end(target, head: str, out: Path) -> list[dict]:
    from draftsmith.runtime.bench.run import BenchRequest, run_bench

    request = BenchRequest(
        drafts=[f"eagle3:{head}"], trees=["chain:3", "dynamic:depth=4,topk=4,tokens=16", "auto:4",
                                          "chain:3+graphs"],
        prompts="jsonl:configs/prompts/runtime-bench.jsonl", num_prompts=8, max_new_tokens=128,
        batch_sizes=[1, 8], baselines=["plain", "plain+graphs", "hf"], out=str(out / "bench"), roofline=False,
        command="python scripts/gpu_measure.py (end to end)",
    )  # fmt: skip
    return run_bench(request, target=target)["rows"]


def runtime_efficiency(target, prompts: int = 4, new_tokens: int = 96, repeats: int = 2) -> list[dict]:
    """Speedup / tau without a trained head (random weights allowed): plain, n-gram chain:3 and early
    exit (the first 3/4 of the layers) chain:2, each eager and on the static/CUDA-graph path, batch 1,
    on token-id prompts that repeat (so n-gram lookup has matches); interleaved, median of `repeats`."""
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import chain

    g = torch.Generator().manual_seed(0)
    ids = [
        torch.randint(0, min(target.vocab_size, 30000), (24,), generator=g).tolist() * 3
        for _ in range(prompts)
    ]
    exit_layers = max(1, target.num_layers * 3 // 4)
    drafters = {
        "ngram@chain:3": build_drafter("ngram", target, chain(3)),
        f"self:layers={exit_layers}@chain:2": build_drafter(f"self:layers={exit_layers}", target, chain(2)),
    }

    def run(name, static):
        if name == "plain":
            return generate_plain(target, ids, SamplingParams(), new_tokens, static=static)
        return generate_speculative(target, drafters[name], ids, SamplingParams(), new_tokens, static=static)

    names = ["plain", *drafters]
    walls = {(n, s): [] for n in names for s in (False, True)}
    forwards = {}
    for key in walls:  # warm-up (and graph capture)
        run(*key)
    for _ in range(repeats):
        for key in walls:
            _sync(target.device)
            start = time.perf_counter()
            results = run(*key)
            _sync(target.device)
            walls[key].append(time.perf_counter() - start)
            forwards[key] = (sum(r.new_tokens for r in results), sum(r.target_forwards for r in results))
    base = statistics.median(walls[("plain", False)])
    rows = []
    for (name, static), times in walls.items():
        tokens, target_forwards = forwards[(name, static)]
        wall = statistics.median(times)
        speedup, tau = base / wall, tokens / target_forwards
        rows.append({"method": name + ("+graphs" if static else ""), "tokens_per_s": round(tokens / wall, 2),
                     "speedup_vs_eager_plain": round(speedup, 3), "tau": round(tau, 3),
                     "efficiency": round(speedup / tau, 3)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--small", action="store_true", help="tiny random shapes instead of 8B (plumbing check)"
    )
    parser.add_argument("--head", help="an EAGLE-3 head folder for the end-to-end rows")
    parser.add_argument(
        "--target",
        default="smollm2-135m",
        help="the embedded target: its alias, or its GGUF carried by scripts/gpu_carry.py",
    )
    parser.add_argument("--out", default="runs/gpu-check/measure.json")
    args = parser.parse_args()
    from draftsmith.runtime.bench.roofline import machine_rates
    from draftsmith.runtime.core.target import Target

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    device = torch.device(args.device)
    result: dict = {"date": time.strftime("%Y-%m-%d"), "platform": platform.platform()}
    result["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    result["machine"] = machine_rates(device, cache=False)
    try:  # the GPU machine has no network and calls carry 64 MiB: the GGUF is there only if carried
        embedded = Target.load(args.target, device=args.device, dtype=str(dtype).removeprefix("torch."))
    except Exception as err:  # noqa: BLE001 - any failure: measure the same shape with random weights
        result["embedded_error"] = f"{type(err).__name__}: {err}"
        embedded = random_target(SMOLLM2, args.device, dtype, StubTokenizer())
        args.head = None  # a trained head needs the real target
    big = random_target(SMALL if args.small else LLAMA_8B, args.device, dtype, embedded.tokenizer)

    def save() -> None:  # after every section: a timeout keeps what was measured
        out.write_text(json.dumps(result, indent=1))

    result["plain"] = [
        plain_vs_roofline(t, result["machine"], 128, 32 if args.small else 256) for t in (embedded, big)
    ]
    save()
    nodes = [1, 2, 4, 8] if args.small else [1, 2, 4, 8, 16, 32, 64, 96, 128]
    result["verify_8b_shape"] = verify_curve(big, nodes)
    save()
    if args.head:  # the goal's own measurement (the trained head on its target) before the proxy below
        result["end_to_end"] = end_to_end(embedded, args.head, out.parent)
        save()
    result["efficiency_8b_shape"] = runtime_efficiency(big)  # no head needed: random weights are fine
    save()
    print_table(result)
    # last (it compiles per shape, and a timeout then loses only this): FlexAttention in the same replays
    flex = result["verify_8b_shape"]["ms_graphs_flex_attention"] = graphed_verify_with(big, nodes, "flex")
    save()
    print(
        f"\nverification at 8B shape, graph replays with FlexAttention in every layer, ms per nodes: {flex}"
    )


def print_table(r: dict) -> None:
    m = r["machine"]
    print(
        f"\n{r['gpu'] or r['platform']}: copy {m['bandwidth_gb_s']} GB/s, matmul {m['matmul_tflops']} TFLOP/s"
    )
    print("| target | tok/s eager | tok/s graphs | memory-bound ceiling | share eager | share graphs "
          "(goal 8B >= 0.75) |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for p in r["plain"]:
        print(
            f"| {p['target']} | {p['tokens_per_s']} | {p['tokens_per_s_graphs']} "
            f"| {p['roofline']['memory_bound_tokens_per_s']} | {p['share_of_roofline']} "
            f"| {p['share_of_roofline_graphs']} |"
        )
    v = r["verify_8b_shape"]
    kernel = v["ms_graphs_kernel_attention"]
    print(
        "\n| nodes | ms eager | x one | ms graphs | x one graphs (goal 64 <= 1.2) | ms graphs, kernel attn |"
        "\n|---:|---:|---:|---:|---:|---:|"
    )
    for n, ms in v["ms"].items():
        cell = kernel[n] if isinstance(kernel, dict) else "error"
        print(f"| {n} | {ms} | {v['x_one'][n]} | {v['ms_graphs'][n]} | {v['x_one_graphs'][n]} | {cell} |")
    if isinstance(kernel, str):
        print(f"kernel attention failed: {kernel}")
    print("\n| 8B shape, batch 1 | tok/s | speedup vs eager plain | tau | efficiency (goal >= 0.8) |")
    print("|---|---:|---:|---:|---:|")
    for row in r["efficiency_8b_shape"]:
        print(f"| {row['method']} | {row['tokens_per_s']} | {row['speedup_vs_eager_plain']} | {row['tau']} "
              f"| {row['efficiency']} |")  # fmt: skip
    for row in r.get("end_to_end", []):
        print(
            f"{row['method']} b={row['batch_size']}: {row['tokens_per_s']} tok/s, "
            f"speedup {row['speedup_vs_plain']}, "
            f"tau {row.get('mean_accepted')}, efficiency {row.get('efficiency')}, greedy identical "
            f"{row.get('greedy_identical')}"
            + (f" (near-ties only: {row['greedy_near_ties_only']})" if "greedy_near_ties_only" in row else "")
        )


if __name__ == "__main__":
    main()
