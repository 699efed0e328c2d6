"""The fused CPU trainer (lessons 10-13): a GPT whose forward and backward are
hand-written numba kernels on preallocated buffers, AdamW, threads/MPI.

It never imports the tape (engine.tensor and friends); the two engines share
only engine.gpt_config (the model's shape and initial weights), engine.timing,
engine.numba_config, engine.fast_math, engine.constants, engine.blas and
engine.fused_buffers (the step's buffers, which the budget reads too; SHARED in
tests/test_layering.py).

    train.py             the training loop: where a run runs, what it starts from,
                         where it reports; start reading here
    step.py              the one training step (train and bench both run it), and the
                         model it needs
    model.py             FusedGPT: buffers, forward, backward
    kernel_registry.py   which function runs each kernel name; use_kernel replaces one
    kernels/             the fused numba kernels, each backward beside its forward;
                         kernels/cpu/ the back end beneath them, with its measurements
    arena.py             one block of memory for a step's buffers, on huge pages
    optim.py             AdamW over the flat parameter buffer, lr schedule
    parallel.py          model replicas on threads, their gradients summed
    mpi_job.py           the MPI job: ranks, rows per rank, the gradient all-reduce,
                         every rank agreeing before step 1, aborting on a failure
    thread_plan.py       replicas or threaded kernels: the rule (lab/THREADS.md), and
                         setting numba's and BLAS's thread pools from its choice
    compile_ahead.py     a cold cache: the backward's kernels compiled in a helper process
    data.py              character tokenizer, built-in corpus, batches
    checkpoint_files.py  save / load / check a checkpoint file
    config.py            TrainConfig and the errors the command line reports
    preflight.py         checks before step 1: paths, prompt, memory needed against free
    cli.py               `python -m engine.train`
    child_process.py     how a helper process (compile_ahead, the lab's PyTorch twin) starts
    lab/                 `python -m engine.bench`: measurements of the trainer, and the
                         thread plan's (THREADS.md); the trainer never imports it
"""
