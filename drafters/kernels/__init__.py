"""CPU kernels built where they run (`-march=native`), for the decoders' few-row products."""
