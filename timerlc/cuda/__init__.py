"""The CUDA backend: kernel IR rendered as CUDA C (``render``), and the host emulation that
runs the same text on the CPU (``emu``)."""
