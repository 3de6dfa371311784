// x (M, K) @ w (N, K)^T for a few rows M, float32: the target's and drafters' linears at
// decode time (1 .. ~16 positions a call), where BLAS kernels built for large M either stream
// the weights once per row (matrix-vector) or repack them on every call.
//
// The weights are packed once (by the caller, `pack` layout below): panel p holds the VEC
// weight rows p*VEC .. p*VEC+VEC-1, K-major, so one vector load brings one k of VEC outputs.
// A tile of R rows of x and C panels keeps R*C vector accumulators in registers and, per k,
// loads C weight vectors and broadcasts R scalars of x (no horizontal sums, no repacking):
// every weight byte comes from memory once per call, whatever M.
//
// Batch-invariant by construction: y[i, j] = fma(x[i, K-1], w[j, K-1], ... fma(x[i, 0],
// w[j, 0], 0)), in order over k, the same operations whatever M is and wherever row i sits in
// x, so one row decoded alone and the same row inside a verify batch get bit-identical outputs.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX512F__)
constexpr int VEC = 16, RMAX = 6, CMAX = 4;  // 24 accumulators + 4 weight vectors of 32 zmm
#else
constexpr int VEC = 8, RMAX = 6, CMAX = 2;   // AVX2: 12 + 2 + a broadcast of 16 ymm
#endif
typedef float vec __attribute__((vector_size(VEC * 4)));

template <int R, int C>  // R rows of x, C panels (C * VEC outputs, `ncols` of them real)
static inline void tile(const float* __restrict x, int64_t K, const float* __restrict wp,
                        float* __restrict y, int64_t ldy, int64_t ncols) {
  vec acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = (vec){};
  const int64_t panel = K * VEC;
  for (int64_t k = 0; k < K; ++k) {
    vec wv[C];
    for (int j = 0; j < C; ++j) __builtin_memcpy(&wv[j], wp + j * panel + k * VEC, sizeof(vec));
    for (int i = 0; i < R; ++i) {
      const float xi = x[i * K + k];
      for (int j = 0; j < C; ++j) acc[i][j] += xi * wv[j];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      const int64_t n0 = j * VEC;
      if (n0 + VEC <= ncols) __builtin_memcpy(y + i * ldy + n0, &acc[i][j], sizeof(vec));
      else
        for (int64_t t = 0; n0 + t < ncols; ++t) y[i * ldy + n0 + t] = acc[i][j][t];
    }
}

template <int R, int C>  // a last tile of r < RMAX rows
static inline void tail_rows(int r, const float* x, int64_t K, const float* wp, float* y,
                             int64_t ldy, int64_t ncols) {
  if constexpr (R >= 1) {
    if (r == R) tile<R, C>(x, K, wp, y, ldy, ncols);
    else tail_rows<R - 1, C>(r, x, K, wp, y, ldy, ncols);
  }
}

template <int C>  // every row of x against C panels
static void all_rows(const float* x, int64_t M, int64_t K, const float* wp, float* y,
                     int64_t ldy, int64_t ncols) {
  int64_t i = 0;
  for (; i + RMAX <= M; i += RMAX) tile<RMAX, C>(x + i * K, K, wp, y + i * ldy, ldy, ncols);
  if (M > i) tail_rows<RMAX - 1, C>(int(M - i), x + i * K, K, wp, y + i * ldy, ldy, ncols);
}

template <int C>  // a last group of c < CMAX panels
static inline void tail_panels(int c, const float* x, int64_t M, int64_t K, const float* wp,
                               float* y, int64_t ldy, int64_t ncols) {
  if constexpr (C >= 1) {
    if (c == C) all_rows<C>(x, M, K, wp, y, ldy, ncols);
    else tail_panels<C - 1>(c, x, M, K, wp, y, ldy, ncols);
  }
}

int64_t vec_width() { return VEC; }

// x (M, K) float32, wp (P, K, VEC) = w (N, K) packed (zero rows past N), N -> y (M, N)
torch::Tensor small_linear(torch::Tensor x, torch::Tensor wp, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && wp.dim() == 3 && x.size(1) == wp.size(1) && wp.size(2) == VEC &&
                  wp.size(0) == (N + VEC - 1) / VEC,
              "small_linear: x (M, K) and packed w (ceil(N / ", VEC, "), K, ", VEC, "), got ",
              x.sizes(), ", ", wp.sizes(), " and N = ", N);
  TORCH_CHECK(x.scalar_type() == at::kFloat && wp.scalar_type() == at::kFloat,
              "small_linear: float32 only");
  TORCH_CHECK(x.device().is_cpu() && wp.device().is_cpu(), "small_linear: CPU tensors only");
  x = x.contiguous();
  wp = wp.contiguous();
  const int64_t M = x.size(0), K = x.size(1), P = wp.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* w = wp.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (P + CMAX - 1) / CMAX, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p = g * CMAX, n0 = p * VEC;
      const int64_t ncols = std::min<int64_t>(N - n0, CMAX * VEC);
      const float* wg = w + p * K * VEC;
      if (p + CMAX <= P) all_rows<CMAX>(xp, M, K, wg, yp + n0, N, ncols);
      else tail_panels<CMAX - 1>(int(P - p), xp, M, K, wg, yp + n0, N, ncols);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x (M, K) @ w (N, K)^T from w packed, batch-invariant");
  m.def("vec_width", &vec_width, "the panel width VEC of the packed layout on this build");
}
