"""The runtime: loads a plan and runs it; never imports the compiler."""
