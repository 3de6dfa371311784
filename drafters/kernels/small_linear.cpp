// x (M, K) @ w (N, K)^T for a few rows M, float32 or bfloat16: the target's and drafters'
// linears at decode time (1 .. ~32 positions a call), where BLAS kernels built for large M either
// stream the weights once per row (matrix-vector) or repack them on every call.
//
// The weights are packed once (`packed` in small_linear.py): panel p holds the VEC
// weight rows p*VEC .. p*VEC+VEC-1, K-major, so one vector load brings one k (float32) or one
// pair of k (bfloat16, the two values of a row side by side) of VEC outputs. A tile of R rows
// of x and C panels keeps R*C float32 vector accumulators in registers and, per step, loads C
// weight vectors and broadcasts R values of x (no horizontal sums, no repacking): every weight
// byte comes from memory once per call, whatever M.
//
// bfloat16: products and sums in float32 (AVX512-BF16's dot product of pairs where the processor
// has it, else both halves widened to float32 and two FMAs), the result rounded to bfloat16 once,
// at the end (round to nearest even), as oneDNN's bf16 GEMM does.
//
// Batch-invariant by construction: y[i, j] is the same sequence of operations over k, in order,
// whatever M is and wherever row i sits in x, so one row decoded alone and the same row inside a
// verify batch get bit-identical outputs.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

// A tile of R rows runs C(R) panels: enough independent accumulator chains to hide the latency
// of the multiply-add (a 1-row tile of 4 panels waited on it: half the speed of 6 rows), within
// the vector registers (R * C accumulators + C weight vectors + a broadcast). C(R) divides GROUP,
// the panels a thread takes at a time. Which C a row's tile runs does not change its sums.
#if defined(__AVX512F__)
constexpr int VEC = 16, RMAX = 6, GROUP = 12;  // 32 zmm
constexpr int cols_for(int R) { return R == 1 ? 12 : R <= 3 ? 6 : 4; }
#else
constexpr int VEC = 8, RMAX = 6, GROUP = 6;   // AVX2: 16 ymm
constexpr int cols_for(int R) { return R == 1 ? 6 : R <= 3 ? 3 : 2; }
#endif
typedef float vec __attribute__((vector_size(VEC * 4)));
typedef uint32_t uvec __attribute__((vector_size(VEC * 4)));

struct F32 {  // one k a step: w panel (P, K, VEC), x (M, K)
  using T = float;
  using X = float;
  static constexpr int PER_STEP = 1;
  static inline vec load(const T* p) { vec v; __builtin_memcpy(&v, p, sizeof v); return v; }
  static inline X broadcast(const T* x) { return *x; }
  static inline void madd(vec& acc, vec w, X x) { acc += x * w; }
  static inline void put(T* y, float v) { *y = v; }
};

struct BF16 {  // a pair of k a step: w panel (P, K/2, VEC, 2), x (M, K), K even
  using T = c10::BFloat16;
  using X = uint32_t;  // x[i, 2s] in the low half, x[i, 2s + 1] in the high half
  static constexpr int PER_STEP = 2;
  static inline uvec load(const T* p) { uvec v; __builtin_memcpy(&v, p, sizeof v); return v; }
  static inline X broadcast(const T* x) { X v; __builtin_memcpy(&v, x, sizeof v); return v; }
#if defined(__AVX512BF16__)
  static constexpr const char* how = "avx512bf16";
  static inline void madd(vec& acc, uvec w, X x) {
    acc = _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32(int(x)));
  }
#else
  static constexpr const char* how = "widened";
  // bfloat16 is float32's high half; the high pair first, as VDPBF16PS sums (the products are
  // exact in float32, so both builds round the same sums, denormals aside: it flushes them)
  static inline void madd(vec& acc, uvec w, X x) {
    const float lo = __builtin_bit_cast(float, x << 16);
    const float hi = __builtin_bit_cast(float, x & 0xffff0000u);
    acc += hi * (vec)(w & 0xffff0000u);
    acc += lo * (vec)(w << 16);
  }
#endif
  static inline void put(T* y, float v) { *y = c10::BFloat16(v); }  // round to nearest even
};

template <class E, int R, int C>  // R rows of x, C panels (C * VEC outputs, `ncols` of them real)
static inline void tile(const typename E::T* __restrict x, int64_t K,
                        const typename E::T* __restrict wp, typename E::T* __restrict y,
                        int64_t ldy, int64_t ncols) {
  using W = decltype(E::load(wp));
  vec acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = (vec){};
  const int64_t panel = K * VEC, steps = K / E::PER_STEP, stride = VEC * E::PER_STEP;
  for (int64_t s = 0; s < steps; ++s) {
    W wv[C];
    for (int j = 0; j < C; ++j) wv[j] = E::load(wp + j * panel + s * stride);
    for (int i = 0; i < R; ++i) {
      const auto xi = E::broadcast(x + i * K + s * E::PER_STEP);
      for (int j = 0; j < C; ++j) E::madd(acc[i][j], wv[j], xi);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      const int64_t n0 = j * VEC;
      if constexpr (std::is_same_v<typename E::T, float>) {
        if (n0 + VEC <= ncols) {
          __builtin_memcpy(y + i * ldy + n0, &acc[i][j], sizeof(vec));
          continue;
        }
      }
      for (int64_t t = 0; t < VEC && n0 + t < ncols; ++t) E::put(y + i * ldy + n0 + t, acc[i][j][t]);
    }
}

template <class E, int R, int C>  // R rows against the last c < C(R) panels of a group
static inline void tail_panels(int c, const typename E::T* x, int64_t K, const typename E::T* wp,
                               typename E::T* y, int64_t ldy, int64_t ncols) {
  if constexpr (C >= 1) {
    if (c == C) tile<E, R, C>(x, K, wp, y, ldy, ncols);
    else tail_panels<E, R, C - 1>(c, x, K, wp, y, ldy, ncols);
  }
}

template <class E, int R>  // R rows of x against np panels (ncols real outputs)
static void rows_by_panels(const typename E::T* x, int64_t K, const typename E::T* wp,
                           typename E::T* y, int64_t ldy, int64_t np, int64_t ncols) {
  constexpr int C = cols_for(R);
  int64_t p = 0;
  for (; p + C <= np; p += C)
    tile<E, R, C>(x, K, wp + p * K * VEC, y + p * VEC, ldy, std::min<int64_t>(ncols - p * VEC, C * VEC));
  if (p < np)
    tail_panels<E, R, C - 1>(int(np - p), x, K, wp + p * K * VEC, y + p * VEC, ldy, ncols - p * VEC);
}

template <class E, int R>  // the last r < RMAX rows
static inline void tail_rows(int r, const typename E::T* x, int64_t K, const typename E::T* wp,
                             typename E::T* y, int64_t ldy, int64_t np, int64_t ncols) {
  if constexpr (R >= 1) {
    if (r == R) rows_by_panels<E, R>(x, K, wp, y, ldy, np, ncols);
    else tail_rows<E, R - 1>(r, x, K, wp, y, ldy, np, ncols);
  }
}

template <class E>
static void run(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, torch::Tensor& y) {
  using T = typename E::T;
  const int64_t M = x.size(0), K = x.size(1), P = wp.size(0);
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  const T* w = reinterpret_cast<const T*>(wp.data_ptr());
  T* yp = reinterpret_cast<T*>(y.data_ptr());
  // each thread a contiguous run of panels (an even share: SmolLM2's 576 outputs are 36 panels,
  // 3 groups, which two threads would split 2:1), taken GROUP panels at a time
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p += GROUP) {  // GROUP panels (their weights stay in L2 across rows)
      const int64_t np = std::min<int64_t>(GROUP, p1 - p), n0 = p * VEC;
      const int64_t ncols = std::min<int64_t>(N - n0, np * VEC);
      const T* wg = w + p * K * VEC;
      const int64_t full = M / RMAX * RMAX;
      constexpr int C = cols_for(RMAX);
      for (int64_t q = 0; q < np; q += C)  // whole tiles of rows: each C panels from L1/L2
        for (int64_t i = 0; i < full; i += RMAX)
          rows_by_panels<E, RMAX>(xp + i * K, K, wg + q * K * VEC, yp + i * N + n0 + q * VEC, N,
                                  std::min<int64_t>(C, np - q), ncols - q * VEC);
      if (M > full)  // the last rows against the whole group, in tiles of their own width
        tail_rows<E, RMAX - 1>(int(M - full), xp + full * K, K, wg, yp + full * N + n0, N, np, ncols);
    }
  });
}

int64_t vec_width() { return VEC; }
std::string bf16_products() { return BF16::how; }

// x (M, K), wp = w (N, K) packed (zero rows past N): float32 (P, K, VEC), bfloat16
// (P, K / 2, VEC, 2) with K even; -> y (M, N) in x's dtype
torch::Tensor small_linear(torch::Tensor x, torch::Tensor wp, int64_t N) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK((x.scalar_type() == at::kFloat || bf16) && wp.scalar_type() == x.scalar_type(),
              "small_linear: float32 or bfloat16, x and w alike; got ", x.scalar_type(), " and ",
              wp.scalar_type());
  const int64_t P = (N + VEC - 1) / VEC;
  const bool shapes = bf16 ? x.dim() == 2 && wp.dim() == 4 && x.size(1) == 2 * wp.size(1) &&
                                 wp.size(2) == VEC && wp.size(3) == 2 && wp.size(0) == P
                           : x.dim() == 2 && wp.dim() == 3 && x.size(1) == wp.size(1) &&
                                 wp.size(2) == VEC && wp.size(0) == P;
  TORCH_CHECK(shapes, "small_linear: x (M, K) and packed w (ceil(N / ", VEC, "), K, ", VEC,
              ") for float32, (ceil(N / ", VEC, "), K / 2, ", VEC, ", 2) for bfloat16 (K even), got ",
              x.sizes(), ", ", wp.sizes(), " and N = ", N);
  TORCH_CHECK(x.device().is_cpu() && wp.device().is_cpu(), "small_linear: CPU tensors only");
  x = x.contiguous();
  wp = wp.contiguous();
  auto y = torch::empty({x.size(0), N}, x.options());
  if (bf16) run<BF16>(x, wp, N, y);
  else run<F32>(x, wp, N, y);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x (M, K) @ w (N, K)^T from w packed, batch-invariant");
  m.def("vec_width", &vec_width, "the panel width VEC of the packed layout on this build");
  m.def("bf16_products", &bf16_products, "how this build multiplies bfloat16: avx512bf16 or widened");
}
