"""The project's own GPU kernels and their builders: the row mode's matrix products and
attention (``row_products``, ``row_attention``), the CUDA Gated DeltaNet recurrence
(``gdn_kernel``), the CUDA source helpers they share (``cuda_source``) and the parallel
prebuild of MLX's kernels after a load (``kernel_prebuild``). Decoding (``app.engine``) calls
them; they import nothing above the engine."""
