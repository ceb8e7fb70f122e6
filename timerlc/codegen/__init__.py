"""Code generation: the plan's statements as kernels of a small kernel IR (``kir``), made by
``lower`` and rendered to LLVM IR by ``timerlc.llvm`` (and, later, to CUDA C)."""
