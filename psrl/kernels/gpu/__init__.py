"""Step kernels for the decoder's GPU path: Triton kernels and their torch reference.

`psrl.kernels.gpu.step` names the operations a step needs (`StepKernels`); `reference.py`
implements them with the model's own torch functions (any device, the eager path the Triton
kernels are tested against), and the `triton_*.py` modules implement them in Triton. Those import
`triton` at the top, so only `load_triton_kernels` imports them, after checking that Triton is there.
"""
