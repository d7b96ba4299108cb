// The routed experts of one mixture-of-experts layer on a CPU, in one call: for each expert in
// turn, its gate, up and down weights read from memory once and applied to all of its rows (the
// (token, choice) pairs routed to it, sorted by expert), fp32 accumulation, SiLU(gate) * up, then
// down. Built and loaded by moe_native.py (g++ -O3 -march=native, ctypes); see that file.
//
// Each projection is out[r][o] = sum_k in[r][k] * w[o][k] for the few rows r of one expert. fp32
// (AVX-512 FMA) and bf16 without AMX (AVX-512 BF16 dot products): a tile of OB weight rows times
// RB input rows held in OB * RB vector accumulators, the weight rows streamed once per tile
// (re-read from L1 for the next RB rows), the next weights prefetched. bf16 with AMX (widths
// multiples of 32): tile multiplies (expert_amx). Each piece of the code is guarded by the
// instructions the compiler targets (-march=native), and caidllm_moe_dtypes says what runs.
// Rounding follows the loop kernel (torch, bf16): gate, up, silu(gate), the product and the
// output each rounded to the weights' dtype; fp32 has nothing to round.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define CAIDLLM_F32 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define CAIDLLM_BF16 1
#endif
#if CAIDLLM_BF16 && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define CAIDLLM_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

#ifndef CAIDLLM_PREFETCH_BYTES
#define CAIDLLM_PREFETCH_BYTES 1024
#endif
#ifndef CAIDLLM_PREFETCH_HINT
#define CAIDLLM_PREFETCH_HINT _MM_HINT_T0
#endif
constexpr int PREFETCH_BYTES = CAIDLLM_PREFETCH_BYTES;  // how far ahead of each weight row's read lines are asked for

inline float bf16_to_float(uint16_t v) {
    uint32_t bits = uint32_t(v) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // NaN stays NaN
    return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

#if CAIDLLM_F32
struct F32 {
    using T = float;
    static constexpr int LANES = 16;
    static __m512 load(const T *p) { return _mm512_loadu_ps(p); }
    static __m512 load_part(const T *p, int n) { return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p); }
    static __m512 madd(__m512 acc, __m512 w, __m512 x) { return _mm512_fmadd_ps(w, x, acc); }
    static T round(float v) { return v; }
    static float widen(T v) { return v; }
};
#endif

#if CAIDLLM_BF16
struct BF16 {
    using T = uint16_t;
    static constexpr int LANES = 32;  // 32 bf16 per vector, summed in pairs into 16 fp32 lanes
    static __m512i load(const T *p) { return _mm512_loadu_si512(p); }
    static __m512i load_part(const T *p, int n) { return _mm512_maskz_loadu_epi16(__mmask32((1ull << n) - 1), p); }
    static __m512 madd(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
    static T round(float v) { return float_to_bf16(v); }
    static float widen(T v) { return bf16_to_float(v); }
};
#endif

#ifndef CAIDLLM_K_BLOCK
#define CAIDLLM_K_BLOCK 1024
#endif
// Inputs taken K_BLOCK at a time, so that a tile's weights and rows stay in L1 while the next rows reuse them.
constexpr int64_t K_BLOCK = CAIDLLM_K_BLOCK;

struct Span {  // one block of the inputs: its length, the rows' stride, prefetch the weights, add to y
    int64_t len, stride;
    bool prefetch, add;
};

// y[r * ldy + o] (+)= sum_k x[r * stride + k] * w[o * stride + k] for o < OB, r < RB, k < span.len.
template <class Ops, int OB, int RB>
void tile(const typename Ops::T *w, const typename Ops::T *x, Span span, float *y, int64_t ldy) {
    constexpr int L = Ops::LANES;
    constexpr int AHEAD = PREFETCH_BYTES / sizeof(typename Ops::T);
    const int64_t k_len = span.len, stride = span.stride;
    __m512 acc[OB][RB];
    for (int o = 0; o < OB; ++o)
        for (int r = 0; r < RB; ++r) acc[o][r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + L <= k_len; k += L) {
        decltype(Ops::load(w)) wv[OB];
        for (int o = 0; o < OB; ++o) {
            if (PREFETCH_BYTES && span.prefetch)
                _mm_prefetch((const char *)(w + o * stride + k + AHEAD), CAIDLLM_PREFETCH_HINT);
            wv[o] = Ops::load(w + o * stride + k);
        }
        for (int r = 0; r < RB; ++r) {
            auto xv = Ops::load(x + r * stride + k);
            for (int o = 0; o < OB; ++o) acc[o][r] = Ops::madd(acc[o][r], wv[o], xv);
        }
    }
    if (k < k_len) {
        int rest = int(k_len - k);
        for (int r = 0; r < RB; ++r) {
            auto xv = Ops::load_part(x + r * stride + k, rest);
            for (int o = 0; o < OB; ++o) acc[o][r] = Ops::madd(acc[o][r], Ops::load_part(w + o * stride + k, rest), xv);
        }
    }
    for (int o = 0; o < OB; ++o)
        for (int r = 0; r < RB; ++r) {
            float sum = _mm512_reduce_add_ps(acc[o][r]);
            y[r * ldy + o] = span.add ? y[r * ldy + o] + sum : sum;
        }
}

// One block of OB weight rows against all `rows` input rows, RB at a time (the rest 1-3 at a time).
template <class Ops, int OB, int RB>
void row_blocks(const typename Ops::T *w, const typename Ops::T *x, int64_t rows, int64_t k_len, float *y,
                int64_t ldy) {
    for (int64_t k0 = 0; k0 < k_len; k0 += K_BLOCK) {
        Span span{k_len - k0 < K_BLOCK ? k_len - k0 : K_BLOCK, k_len, true, k0 > 0};
        int64_t r = 0;
        for (; r + RB <= rows; r += RB, span.prefetch = false)
            tile<Ops, OB, RB>(w + k0, x + r * k_len + k0, span, y + r * ldy, ldy);
        const typename Ops::T *xr = x + r * k_len + k0;
        float *yr = y + r * ldy;
        switch (rows - r) {
            case 3: tile<Ops, OB, 3>(w + k0, xr, span, yr, ldy); break;
            case 2: tile<Ops, OB, 2>(w + k0, xr, span, yr, ldy); break;
            case 1: tile<Ops, OB, 1>(w + k0, xr, span, yr, ldy); break;
            default: break;
        }
    }
}

// y [rows, out] (fp32) = x [rows, k_len] @ w [out, k_len]^T, the weights streamed once.
template <class Ops, int OB, int RB>
void project_blocks(const typename Ops::T *w, int64_t out, int64_t k_len, const typename Ops::T *x, int64_t rows,
                    float *y) {
    int64_t o = 0;
    for (; o + OB <= out; o += OB) row_blocks<Ops, OB, RB>(w + o * k_len, x, rows, k_len, y + o, out);
    for (; o < out; ++o) row_blocks<Ops, 1, 4>(w + o * k_len, x, rows, k_len, y + o, out);
}

template <class Ops>
void project(const typename Ops::T *w, int64_t out, int64_t k_len, const typename Ops::T *x, int64_t rows, float *y) {
    if (rows == 1)
        project_blocks<Ops, 8, 1>(w, out, k_len, x, rows, y);  // eight independent sums per input vector
    else if (rows == 2)
        project_blocks<Ops, 8, 2>(w, out, k_len, x, rows, y);
    else
        project_blocks<Ops, 4, 4>(w, out, k_len, x, rows, y);
}

struct Scratch {
    float *gate, *up, *out;
    void *hidden;
};

// One expert on its `rows` rows: out = down(silu(gate(x)) * up(x)), rounded as torch rounds.
template <class Ops>
void expert(const typename Ops::T *x, const typename Ops::T *wg, const typename Ops::T *wu, const typename Ops::T *wd,
            int64_t rows, int64_t hidden, int64_t inter, Scratch s, typename Ops::T *out) {
    using T = typename Ops::T;
    project<Ops>(wg, inter, hidden, x, rows, s.gate);
    project<Ops>(wu, inter, hidden, x, rows, s.up);
    T *h = static_cast<T *>(s.hidden);
    for (int64_t i = 0; i < rows * inter; ++i) {
        float g = Ops::widen(Ops::round(s.gate[i]));
        float silu = Ops::widen(Ops::round(g / (1.0f + expf(-g))));
        h[i] = Ops::round(silu * Ops::widen(Ops::round(s.up[i])));
    }
    project<Ops>(wd, hidden, inter, h, rows, s.out);
    for (int64_t i = 0; i < rows * hidden; ++i) out[i] = Ops::round(s.out[i]);
}

#if CAIDLLM_AMX
// bf16 on AMX: the tile multiply's own sums (16 weight rows x 32 inputs x up to 16 rows per
// instruction) leave the weights' read as the only cost. y^T = W x^T: A is a [16, 32] block of
// the weights as stored, B the rows' inputs packed in pairs ([k / 2, rows] of 32-bit pairs).
constexpr int AMX_ROWS = 32;  // rows per pass over an expert's weights (an expert with more takes several)

struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

bool amx_permitted() {  // Linux gives a process AMX's state only when asked (once per process)
    static const bool permitted = __builtin_cpu_supports("amx-bf16") &&
                                  syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return permitted;
}

bool amx_fits(int64_t hidden, int64_t inter) { return hidden % 32 == 0 && inter % 32 == 0 && amx_permitted(); }

// Tiles 0-1: sums of rows 0-15 for two blocks of 16 weight rows, 2-3 the same for rows 16-31;
// 4-5: weights [16, 32]; 6-7: inputs of rows 0-15 and 16-31 (pairs of bf16, 4 bytes a row).
void configure_tiles(int rows) {
    int first = rows < 16 ? rows : 16, second = rows - first;
    TileConfig cfg{};
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        int width = t == 4 || t == 5 ? 16 : (t == 2 || t == 3 || t == 7 ? second : first);
        cfg.rows[t] = width ? 16 : 0;
        cfg.colsb[t] = uint16_t(width * 4);
    }
    _tile_loadconfig(&cfg);
}

// yt [out, rows] (fp32) = w [out, k_len] @ x^T, x packed: pairs[(k / 2) * rows + r] = x[r][k, k + 1].
void amx_project(const uint16_t *w, int64_t out, int64_t k_len, const uint32_t *pairs, int rows, float *yt) {
    const int64_t stride = k_len * 2, packed = rows * 4;
    const bool more = rows > 16;
    for (int64_t o = 0; o < out; o += 32) {
        const bool two = o + 32 <= out;  // out is a multiple of 16: the last block may be a single one
        const uint16_t *wo = w + o * k_len;
        _tile_zero(0);
        _tile_zero(1);
        if (more) {  // a tile configured empty must not be touched
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int64_t k = 0; k < k_len; k += 32) {
            _tile_loadd(6, pairs + (k / 2) * rows, packed);
            if (more) _tile_loadd(7, pairs + (k / 2) * rows + 16, packed);
            _tile_loadd(4, wo + k, stride);
            _tile_dpbf16ps(0, 4, 6);
            if (more) _tile_dpbf16ps(2, 4, 7);
            if (two) {
                _tile_loadd(5, wo + 16 * k_len + k, stride);
                _tile_dpbf16ps(1, 5, 6);
                if (more) _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, yt + o * rows, packed);
        if (more) _tile_stored(2, yt + o * rows + 16, packed);
        if (two) _tile_stored(1, yt + (o + 16) * rows, packed);
        if (two && more) _tile_stored(3, yt + (o + 16) * rows + 16, packed);
    }
}

void pack_rows(const uint16_t *x, int64_t k_len, int rows, uint32_t *pairs) {
    const uint32_t *x32 = reinterpret_cast<const uint32_t *>(x);
    for (int r = 0; r < rows; ++r)
        for (int64_t j = 0; j < k_len / 2; ++j) pairs[j * rows + r] = x32[r * (k_len / 2) + j];
}

// One expert on up to AMX_ROWS rows, rounded as the loop rounds (as expert<BF16>).
void expert_amx(const uint16_t *x, const uint16_t *wg, const uint16_t *wu, const uint16_t *wd, int rows,
                int64_t hidden, int64_t inter, Scratch s, uint16_t *out) {
    uint32_t *pairs = static_cast<uint32_t *>(s.hidden);
    configure_tiles(rows);
    pack_rows(x, hidden, rows, pairs);
    amx_project(wg, inter, hidden, pairs, rows, s.gate);
    amx_project(wu, inter, hidden, pairs, rows, s.up);
    for (int64_t j = 0; j < inter; j += 2)
        for (int r = 0; r < rows; ++r) {
            uint32_t pair = 0;
            for (int half = 0; half < 2; ++half) {
                int64_t i = (j + half) * rows + r;
                float g = bf16_to_float(float_to_bf16(s.gate[i]));
                float silu = bf16_to_float(float_to_bf16(g / (1.0f + expf(-g))));
                pair |= uint32_t(float_to_bf16(silu * bf16_to_float(float_to_bf16(s.up[i])))) << (16 * half);
            }
            pairs[(j / 2) * rows + r] = pair;
        }
    amx_project(wd, hidden, inter, pairs, rows, s.out);
    for (int r = 0; r < rows; ++r)
        for (int64_t o = 0; o < hidden; ++o) out[r * hidden + o] = float_to_bf16(s.out[o * rows + r]);
}
#endif

template <class Ops>
void any_expert(const typename Ops::T *x, const typename Ops::T *wg, const typename Ops::T *wu,
                const typename Ops::T *wd, int64_t rows, int64_t hidden, int64_t inter, Scratch s,
                typename Ops::T *out) {
#if CAIDLLM_AMX
    if constexpr (sizeof(typename Ops::T) == 2) {
        if (amx_fits(hidden, inter)) {
            for (int64_t r = 0; r < rows; r += AMX_ROWS) {
                int n = int(rows - r < AMX_ROWS ? rows - r : AMX_ROWS);
                expert_amx(x + r * hidden, wg, wu, wd, n, hidden, inter, s, out + r * hidden);
            }
            return;
        }
    }
#endif
    expert<Ops>(x, wg, wu, wd, rows, hidden, inter, s, out);
}

template <class Ops>
int all_experts(const void *x_, const void *gate_, const void *up_, const void *down_, const int64_t *counts,
                int64_t experts, int64_t hidden, int64_t inter, void *out_) {
    using T = typename Ops::T;
    const T *x = static_cast<const T *>(x_), *gate = static_cast<const T *>(gate_);
    const T *up = static_cast<const T *>(up_), *down = static_cast<const T *>(down_);
    T *out = static_cast<T *>(out_);
    int64_t most = 0;
    for (int64_t e = 0; e < experts; ++e) most = counts[e] > most ? counts[e] : most;
    if (most == 0) return 0;
    float *buffer = static_cast<float *>(malloc(sizeof(float) * most * (3 * inter + 2 * hidden)));
    if (!buffer) return 2;
    Scratch s{buffer, buffer + most * inter, buffer + 2 * most * inter, buffer + most * (2 * inter + hidden)};
    int64_t start = 0, per_expert = hidden * inter;
    for (int64_t e = 0; e < experts; ++e) {
        if (counts[e] == 0) continue;
        any_expert<Ops>(x + start * hidden, gate + e * per_expert, up + e * per_expert, down + e * per_expert,
                        counts[e], hidden, inter, s, out + start * hidden);
        start += counts[e];
    }
    free(buffer);
#if CAIDLLM_AMX
    if (sizeof(T) == 2 && amx_fits(hidden, inter)) _tile_release();
#endif
    return 0;
}

}  // namespace

extern "C" {

// Which dtypes this build runs on this CPU: bit 0 fp32, bit 1 bf16, bit 2 bf16 on AMX (widths
// that are multiples of 32).
int caidllm_moe_dtypes(void) {
    int bits = 0;
#if CAIDLLM_AMX
    if (amx_permitted()) bits |= 4;
#endif
#if CAIDLLM_F32
    if (__builtin_cpu_supports("avx512f")) bits |= 1;
#endif
#if CAIDLLM_BF16
    if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) bits |= 2;
#endif
    return bits;
}

// x [pairs, hidden]: the routed rows sorted by expert, counts[e] >= 0 rows each; gate and up
// [experts, inter, hidden], down [experts, hidden, inter], out [pairs, hidden]; all contiguous,
// of one dtype (0 fp32, 1 bf16). Returns 0, 1 for a dtype this build cannot run, 2 out of memory.
int caidllm_moe_experts(int dtype, const void *x, const void *gate, const void *up, const void *down,
                        const int64_t *counts, int64_t experts, int64_t hidden, int64_t inter, void *out) {
#if CAIDLLM_F32
    if (dtype == 0) return all_experts<F32>(x, gate, up, down, counts, experts, hidden, inter, out);
#endif
#if CAIDLLM_BF16
    if (dtype == 1) return all_experts<BF16>(x, gate, up, down, counts, experts, hidden, inter, out);
#endif
    return 1;
}

}  // extern "C"
