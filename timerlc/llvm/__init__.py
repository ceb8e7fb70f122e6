"""LLVM IR text for native CPU code: kernels (``render``) and the random draws (``philox``)."""
