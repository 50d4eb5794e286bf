"""Training-step time of a random-init Llama through transformers, with flashattn's
integration or transformers' SDPA path (bf16; defaults: 4 layers, hidden 2048, 16 heads
of 128, 4 KV heads, 4 x 2048 tokens).

    python3 benchmarks/bench_transformers_step.py flashattn
    python3 benchmarks/bench_transformers_step.py sdpa --profile

Prints ms per step (best and median of five loops of five steps, after three warm-up
steps); --profile prints torch.profiler's table of the CUDA kernels of five steps instead.
Needs a CUDA GPU and transformers.
"""

import argparse


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impl", choices=("flashattn", "sdpa"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--profile", action="store_true", help="torch.profiler's kernel table of five steps")
    a = p.parse_args()

    import torch
    import transformers

    import flashattn.integrations.transformers as flashattn_hf

    impl = flashattn_hf.register() if a.impl == "flashattn" else "sdpa"
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=a.layers, num_attention_heads=16, num_key_value_heads=4,
                                   max_position_embeddings=max(4096, a.seqlen))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.bfloat16)
    model = model.cuda().train()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seqlen), device="cuda")

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))
        return
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 5)
    print(f"{a.impl:10} ms per training step: best {min(times):.2f}, median {sorted(times)[2]:.2f}")


if __name__ == "__main__":
    main()
