"""llama.cpp's verify-cost curve on this CPU: the time of one `eval` of N new tokens after a fixed context,
per GGUF, median of repeats. Behind "Our EAGLE-3 head in llama.cpp's own speculative decoding" in
BENCHMARKS.md (why a chain-2 step costs what it does there). Runs under the llama.cpp venv:

    .venv-llamacpp/bin/python scripts/studies/llamacpp_verify_cost.py runs/gguf/smollm2-135m.F32.gguf \
        runs/gguf/smollm2-135m.Q8_0.gguf [--tokens 1,3,5] [--repeats 7] [--context 50] [--threads 2]
"""

import argparse
import statistics
import time

from llama_cpp import Llama


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", nargs="+")
    p.add_argument("--tokens", default="1,3,5", help="new tokens per eval (1 = a plain step)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--context", type=int, default=50, help="tokens already in the cache")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    sizes = [int(n) for n in args.tokens.split(",")]
    for path in args.gguf:
        llm = Llama(path, n_ctx=512, verbose=False, n_threads=args.threads, n_threads_batch=args.threads)
        times = {n: [] for n in sizes}
        for _ in range(args.repeats):
            for n in sizes:  # interleaved: each repeat times every size once
                llm.reset()
                llm.eval(list(range(100, 100 + args.context)))
                start = time.perf_counter()
                llm.eval(list(range(200, 200 + n)))
                times[n].append((time.perf_counter() - start) * 1000)
        ms = {n: statistics.median(v) for n, v in times.items()}
        cells = ", ".join(f"{n} tokens {ms[n]:.1f} ms ({ms[n] / ms[sizes[0]]:.2f}x)" for n in sizes)
        print(f"{path}: {cells}")


if __name__ == "__main__":
    main()
