"""Models evalgate builds for its demo and tests: toy Llamas (`tinymodel`), SmolLM2-135M-Instruct from a
wheel (`smollm2`), and the demo workspace (`demo`)."""
