"""The plan: the serialized result of compiling, the contract with the runtime."""
