"""The trainer's lab: how fast the fused trainer runs, and why.

Nothing in the trainer imports this package (tests/test_layering.py holds
that): a training run never loads it. `python -m engine.bench` is its door.

    cli.py               `python -m engine.bench`: the flags, one shape or a table
    versus_torch.py      ours against PyTorch eager: timed steps in alternating blocks
    first_step.py        the first step: compiled or loaded kernels, page faults
    profile.py           where the time goes, kernel by kernel (KernelProfiler)
    machine.py           the machine: sgemm rates, memory rates against the kept activations
    memory_rates.py      how fast the cores write and read memory
    attention_sweep.py   `--sweep-attention`: both attention kernels and PyTorch's SDPA over T
    report.py            the report as text
    torch_twin.py        the same GPT in PyTorch, in a process of its own
    PERFORMANCE.md       the performance log: what was measured, on which machine, and why
"""
