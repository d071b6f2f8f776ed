// Probe: a lookup-table GEMV for IQ1_S experts, 1 token, on Sapphire Rapids: is 80% of the read
// bandwidth within reach where the gather-and-multiply tiles (packed_tiles_grid.py) stay at ~20%?
// IQ1_S codes are sign-free: 8 weights = one of 2048 ternary grid rows, so for one token every
// 8-activation run's dot product with all 2048 rows can be tabled once (int16, 4 KB a run) and a
// code then costs one 16-bit gather and an add, no product and no sign. The tables are 512x the
// activations, so threads split the columns (each builds the tables of its own 256-column
// blocks, L2-resident) and a reduction over threads sums the partial rows.
// Layout (same bytes as the GGUF, 50 per 256 weights): per 256-column block, per 32-column
// sub-block, per 16-row tile: 16 dwords of low code bytes (code k in byte k) and 16 words of qh
// (3 high bits a code, 3-bit scale, delta sign); then the tiles' 16 fp16 d.
// A V3 MoE layer (8 experts, gate/up 2048 x 7168, down 7168 x 2048, all IQ1_S): phase 1 builds
// the tables of x and runs gate and up (units: one 256-column block of one matrix), phase 2 sums
// the threads' partials and quantizes h, phase 3 runs down (units: expert x block x row quarter),
// phase 4 sums. Checked against a scalar reference on the same bytes (not with -DGROUPS).
// Switches: -DTAB32 int32 tables; -DGROUPS hybrid's packed layout instead (packed_iquants
// .pack_iq1_s: 416-byte blocks of 8-row groups, a tile's two groups a matrix row apart);
// -DNOGATHER everything but the lookups (the floor); LAYERS=1 one layer, L3-resident.
// Measured 2026-11-26 on H100 machines (16 threads; the host's noise moved whole runs 1.6-2.2 ms):
// - this layout, int16: 1.59-1.75 ms a layer (202-222 G weights/s, 39-42 GB/s, 34-62% of the
//   same run's read bandwidth); L3-resident the same (1.65): bound by instructions.
// - without the lookups: 1.00 ms from DRAM (96% of the bandwidth), 0.68 L3-resident: the
//   gathers alone cost ~0.7-1 ms a layer, more than the 0.86 ms 80% of ~100 GB/s allows.
// - int32 tables: the same (1.62-2.05). Breaking the gathers' merge dependency: the same.
// - hybrid's layout (-DGROUPS), same run as this layout's 1.84-2.18: 2.45-2.88 ms (int16 or
//   int32), no better than the gather-and-multiply tiles there (2.25-2.34 ms in other runs); a
//   numba version of it ran 2.7-3.3 ms beside the tiles' 2.3 (not landed).
// So a lookup table wins ~1.3x on IQ1_S only with a layout of its own (16 rows' codes of a
// sub-block contiguous), and no lookup design reaches 80% on this CPU.
// gcc -O3 -march=sapphirerapids -fopenmp probe_lut_gemv.c -o p -lm && OMP_PROC_BIND=spread ./p
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NG 2048
#define TSTRIDE (NG + 32)  // entries a table: a dword gather at 2047 reads one past
#ifdef TAB32  // int32 entries: no gather straddles a cache line
typedef int32_t tab_t;
#define TSCALE 4
#else
typedef int16_t tab_t;
#define TSCALE 2
#endif
#define HID 7168
#define INTER 2048
#define NE 8
#define NMAT (2 * NE)  // gate and up of 8 experts
#define TILE_BYTES 96  // 16 x (4 code bytes + 2 qh bytes) a sub-block
#define GBYTES 416  // GROUPS: an 8-row group's block
#ifdef GROUPS
#define TILE16 (2 * GBYTES)
#else
#define TILE16 800
#endif
#define MAXT 64

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static int8_t grid[NG][8];
static uint32_t GA[NG] __attribute__((aligned(64))), GB[NG] __attribute__((aligned(64)));
static int32_t coef[16] __attribute__((aligned(64)));  // nibble (sign << 3 | s) -> 8(2s+1) | ±(2s+1) << 16

// one matrix: rows x cols (the layouts: load_tile)
static size_t mat_bytes(int rows, int cols) { return (size_t)(rows / 16) * TILE16 * (cols / 256); }

typedef struct { int8_t q[HID]; float xs[HID / 256]; int32_t sums[HID / 32]; } act_t;  // int8 activations

static void quantize(const float *x, int n, act_t *a) {
  for (int b = 0; b < n / 256; b++) {
    float m = 0; for (int i = 0; i < 256; i++) m = fmaxf(m, fabsf(x[256 * b + i]));
    float s = m > 0 ? m / 127 : 1; a->xs[b] = s;
    for (int i = 0; i < 256; i++) a->q[256 * b + i] = (int8_t)lrintf(x[256 * b + i] / s);
  }
  for (int s = 0; s < n / 32; s++) { int t = 0; for (int i = 0; i < 32; i++) t += a->q[32 * s + i]; a->sums[s] = t; }
}

// the 32 tables of one 256-column block: tab[g][i] = sum_j grid[i][j] x[8g + j]
static void build(const int8_t *x, tab_t *tab) {
  for (int g = 0; g < 32; g++) {
    const int8_t *x8 = x + 8 * g;
    int t = 0; for (int j = 0; j < 8; j++) t += x8[j];
    __m512i A = _mm512_set1_epi32(*(const int32_t *)x8), B = _mm512_set1_epi32(*(const int32_t *)(x8 + 4));
    __m512i X8 = _mm512_set1_epi32(t);
    for (int i = 0; i < NG; i += 16) {  // (grid + 1) . x - sum x
      __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(GA + i), A);
      acc = _mm512_sub_epi32(_mm512_dpbusd_epi32(acc, _mm512_load_si512(GB + i), B), X8);
#ifdef TAB32
      _mm512_storeu_si512(tab + g * TSTRIDE + i, acc);
#else
      _mm256_storeu_si256((__m256i *)(tab + g * TSTRIDE + i), _mm512_cvtepi32_epi16(acc));
#endif
    }
  }
}

#define GATHER(i, base) _mm512_i32gather_epi32(i, base, TSCALE)

// One tile's sub-block: the 4 runs' 11-bit codes and the qh words (scale, delta sign), 16 rows.
// This layout: 16 code dwords (run k in byte k) and 16 qh words, 96 contiguous bytes.
// -DGROUPS: two 8-row groups' blocks `row` bytes apart: codes [32 runs][8 rows], qh at 256.
typedef struct { __m512i code[4], H; } tile_t;
static inline tile_t load_tile(const uint8_t *pa, size_t row, int sb) {
  const __m512i hi3 = _mm512_set1_epi32(0x700);
  tile_t c;
#ifdef GROUPS
  const uint8_t *pb = pa + row;
  c.H = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(_mm256_castsi128_si256(
      _mm_loadu_si128((const __m128i *)(pa + 256 + 16 * sb))), _mm_loadu_si128((const __m128i *)(pb + 256 + 16 * sb)), 1));
  __m512i low[4];
  for (int k = 0; k < 4; k++)
    low[k] = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(pa + 32 * sb + 8 * k)),
                                                      _mm_loadl_epi64((const __m128i *)(pb + 32 * sb + 8 * k))));
#else
  (void)row; (void)sb;
  const __m512i Q = _mm512_loadu_si512(pa), lo8 = _mm512_set1_epi32(0xff);
  c.H = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(pa + 64)));
  __m512i low[4] = {_mm512_and_si512(Q, lo8), _mm512_and_si512(_mm512_srli_epi32(Q, 8), lo8),
                    _mm512_and_si512(_mm512_srli_epi32(Q, 16), lo8), _mm512_srli_epi32(Q, 24)};
#endif
  // code k = low byte | qh bits 3k..3k+2 << 8 (A | (B & C))
  c.code[0] = _mm512_ternarylogic_epi32(low[0], _mm512_slli_epi32(c.H, 8), hi3, 0xF8);
  c.code[1] = _mm512_ternarylogic_epi32(low[1], _mm512_slli_epi32(c.H, 5), hi3, 0xF8);
  c.code[2] = _mm512_ternarylogic_epi32(low[2], _mm512_slli_epi32(c.H, 2), hi3, 0xF8);
  c.code[3] = _mm512_ternarylogic_epi32(low[3], _mm512_srli_epi32(c.H, 1), hi3, 0xF8);
  return c;
}

// tiles [t0, t1) of 256-column block b of matrix m (blocks K / 256, tiles rows / 16):
// out[16 i + l] += d * scale * (row's block dot) / 8
static void unit(const uint8_t *m, int blocks, int tiles, int b, int t0, int t1, const tab_t *tab,
                 const int32_t *sums, float scale, float *out, __m512i *acc) {
  const __m512i lo16 = _mm512_set1_epi32(0xffff), cf = _mm512_load_si512(coef);
#ifdef GROUPS
  const size_t row = (size_t)blocks * GBYTES, step = 2 * row, sbstep = 0, ahead = 4;
  const uint8_t *blk = m + (size_t)b * GBYTES;
#else
  const size_t row = 0, step = TILE_BYTES, sbstep = (size_t)tiles * TILE_BYTES, ahead = 8;
  const uint8_t *blk = m + (size_t)b * tiles * 800;
  (void)blocks;
#endif
  for (int sb = 0; sb < 8; sb++) {
    const __m512i xh = _mm512_set1_epi32(sums[sb] << 16);
    const tab_t *t = tab + 4 * sb * TSTRIDE;
    (void)t;
    for (int i = t0; i < t1; i++) {
      const uint8_t *pi = blk + sb * sbstep + i * step;
#ifdef GROUPS  // the blocks of a tile 4 ahead into L2, for all 8 passes
      if (sb == 0) for (int l = 0; l < GBYTES; l += 64) { _mm_prefetch((const char *)pi + ahead * step + l, _MM_HINT_T1);
                                                         _mm_prefetch((const char *)pi + ahead * step + row + l, _MM_HINT_T1); }
#else
      _mm_prefetch((const char *)pi + ahead * step, _MM_HINT_T0);
      _mm_prefetch((const char *)pi + ahead * step + 64, _MM_HINT_T0);
#endif
      tile_t c = load_tile(pi, row, sb);
#ifdef NOGATHER  // the floor: everything but the lookups
      __m512i s = _mm512_add_epi32(_mm512_add_epi32(c.code[0], c.code[1]), _mm512_add_epi32(c.code[2], c.code[3]));
#else
      __m512i s = _mm512_add_epi32(_mm512_add_epi32(GATHER(c.code[0], t), GATHER(c.code[1], t + TSTRIDE)),
                                   _mm512_add_epi32(GATHER(c.code[2], t + 2 * TSTRIDE), GATHER(c.code[3], t + 3 * TSTRIDE)));
#endif
      // words (sum of 4 tables, sum of x) . (8(2s+1), ±(2s+1)): the sub-block in eighths
      __m512i a = _mm512_ternarylogic_epi32(s, lo16, xh, 0xEA);
      __m512i prod = _mm512_madd_epi16(a, _mm512_permutexvar_epi32(_mm512_srli_epi32(c.H, 12), cf));
      acc[i - t0] = sb ? _mm512_add_epi32(acc[i - t0], prod) : prod;
    }
  }
  const __m512 sc = _mm512_set1_ps(scale / 8);
  for (int i = t0; i < t1; i++) {
#ifdef GROUPS
    const float *dp = (const float *)(blk + i * step + 384);
    __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(dp)), _mm256_loadu_ps(dp + row / 4), 1);
#else
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 8 * sbstep + 32 * i)));
#endif
    __m512 o = _mm512_loadu_ps(out + 16 * i);
    _mm512_storeu_ps(out + 16 * i, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[i - t0]), d), sc, o));
  }
}

// scalar reference: one row of a matrix in double
__attribute__((unused)) static double ref_row(const uint8_t *m, int rows, int cols, int r, const act_t *a) {
  int tiles = rows / 16, i = r / 16, l = r % 16; double y = 0;
  for (int b = 0; b < cols / 256; b++) {
    const uint8_t *blk = m + (size_t)b * tiles * 800;
    float d = _cvtsh_ss(((const uint16_t *)(blk + (size_t)8 * tiles * TILE_BYTES + 32 * i))[l]);
    double yb = 0;
    for (int sb = 0; sb < 8; sb++) {
      const uint8_t *p = blk + (size_t)sb * tiles * TILE_BYTES + (size_t)i * TILE_BYTES;
      uint32_t q = ((const uint32_t *)p)[l]; uint16_t h = ((const uint16_t *)(p + 64))[l];
      double delta = h & 0x8000 ? -0.125 : 0.125; int s = (h >> 12) & 7;
      for (int k = 0; k < 4; k++) {
        int idx = ((q >> (8 * k)) & 0xff) | (((h >> (3 * k)) & 7) << 8);
        for (int j = 0; j < 8; j++) yb += (2 * s + 1) * (grid[idx][j] + delta) * a->q[256 * b + 32 * sb + 8 * k + j];
      }
    }
    y += d * a->xs[b] * yb;
  }
  return y;
}

typedef struct { uint8_t *gu[NMAT]; uint8_t *down[NE]; } layer_t;

static float partial[MAXT][NMAT * INTER] __attribute__((aligned(64)));
static tab_t tabs[MAXT][32 * TSTRIDE] __attribute__((aligned(64)));
static __m512i accs[MAXT][128];
static float gu_out[NMAT * INTER], y_out[HID], hf[NE][INTER];
static act_t hq[NE];
static double phase_t[4];

// one MoE layer, 1 token: gate/up on x, h = silu(g) * u, down, weighted sum over the 8 experts
static void layer(const layer_t *L, const act_t *x, const float *w, int nt) {
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    double t0 = now();
    float *part = partial[t];
    memset(part, 0, sizeof(float) * NMAT * INTER);
    const int U1 = (HID / 256) * NMAT;  // unit: (block, matrix)
    int built = -1;
    for (int u = U1 * t / nt; u < U1 * (t + 1) / nt; u++) {
      int b = u / NMAT, m = u % NMAT;
      if (b != built) { build(x->q + 256 * b, tabs[t]); built = b; }
      unit(L->gu[m], HID / 256, INTER / 16, b, 0, INTER / 16, tabs[t], x->sums + 8 * b, x->xs[b],
           part + m * INTER, accs[t]);
    }
#pragma omp barrier
    if (t == 0) phase_t[0] += now() - t0;
    for (int r = NMAT * INTER * t / nt; r < NMAT * INTER * (t + 1) / nt; r++) {
      float s = 0; for (int k = 0; k < nt; k++) s += partial[k][r];
      gu_out[r] = s;
    }
#pragma omp barrier
    for (int e = NE * t / nt; e < NE * (t + 1) / nt; e++) {  // 8 experts over <= 16 threads: some idle
      for (int r = 0; r < INTER; r++) { float g = gu_out[2 * e * INTER + r], v = gu_out[(2 * e + 1) * INTER + r];
        hf[e][r] = g / (1 + expf(-g)) * v; }
      quantize(hf[e], INTER, &hq[e]);
    }
#pragma omp barrier
    if (t == 0) phase_t[1] += now() - t0;
    memset(part, 0, sizeof(float) * HID);
    const int U3 = NE * (INTER / 256) * 4, tiles = HID / 16;  // unit: (expert, block, row quarter)
    built = -1;
    for (int u = U3 * t / nt; u < U3 * (t + 1) / nt; u++) {
      int e = u / 32, b = (u / 4) % 8, q = u % 4;
      if (e * 8 + b != built) { build(hq[e].q + 256 * b, tabs[t]); built = e * 8 + b; }
      unit(L->down[e], INTER / 256, tiles, b, q * tiles / 4, (q + 1) * tiles / 4, tabs[t],
           hq[e].sums + 8 * b, hq[e].xs[b] * w[e], part, accs[t]);
    }
#pragma omp barrier
    if (t == 0) phase_t[2] += now() - t0;
    for (int r = HID * t / nt; r < HID * (t + 1) / nt; r++) {
      float s = 0; for (int k = 0; k < nt; k++) s += partial[k][r];
      y_out[r] = s;
    }
#pragma omp barrier
    if (t == 0) phase_t[3] += now() - t0;
  }
}

static void fill(uint8_t *m, int rows, int cols, uint64_t seed) {
  size_t n = mat_bytes(rows, cols);
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i < n; i += 8) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; memcpy(m + i, &s, 8); }
#ifdef GROUPS  // d: small positive f32 at byte 384 of each group's block
  for (size_t g = 0; g < (size_t)rows / 8 * (cols / 256); g++) {
    float *d = (float *)(m + g * GBYTES + 384);
    for (int i = 0; i < 8; i++) d[i] = 0.002f + 0.001f * ((g + i) % 5);
  }
#else
  const size_t tiles = rows / 16;
  for (int b = 0; b < cols / 256; b++) {  // d: small positive fp16
    uint16_t *d = (uint16_t *)(m + (size_t)b * tiles * 800 + 8 * tiles * TILE_BYTES);
    for (size_t i = 0; i < 16 * tiles; i++) d[i] = _cvtss_sh(0.002f + 0.001f * ((i * 7 + b) % 5), 0);
  }
#endif
}

static double stream_read(const uint8_t *buf, size_t n, int nt) {
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now(); __m512i tot = _mm512_setzero_si512();
#pragma omp parallel num_threads(nt)
    { __m512i a = _mm512_setzero_si512(); int t = omp_get_thread_num();
      for (size_t i = n * t / nt / 64 * 64; i < n * (t + 1) / nt / 64 * 64; i += 64) a = _mm512_add_epi64(a, _mm512_load_si512(buf + i));
#pragma omp critical
      tot = _mm512_add_epi64(tot, a); }
    double t = now() - t0; if (t < best) best = t;
    if (_mm512_reduce_add_epi64(tot) == 42) printf(" ");
  }
  return n / best / 1e9;
}

int main(void) {
  srand(7);
  for (int i = 0; i < NG; i++) for (int j = 0; j < 8; j++) grid[i][j] = (int8_t)(rand() % 3 - 1);
  for (int i = 0; i < NG; i++) { GA[i] = GB[i] = 0;
    for (int j = 0; j < 4; j++) { GA[i] |= (uint32_t)(grid[i][j] + 1) << (8 * j); GB[i] |= (uint32_t)(grid[i][j + 4] + 1) << (8 * j); } }
  for (int n = 0; n < 16; n++) { int s = 2 * (n & 7) + 1; coef[n] = (8 * s) | ((uint32_t)(uint16_t)(n & 8 ? -s : s) << 16); }
  const int NL = getenv("LAYERS") ? atoi(getenv("LAYERS")) : 12;  // 12 x 68.8 MB: past the L3
  size_t gub = mat_bytes(INTER, HID), db = mat_bytes(HID, INTER), per = NMAT * gub + NE * db;
  uint8_t *buf = aligned_alloc(64, per * NL);
  layer_t L[64];
#pragma omp parallel for
  for (int l = 0; l < NL; l++) {
    for (int m = 0; m < NMAT; m++) { L[l].gu[m] = buf + per * l + gub * m; fill(L[l].gu[m], INTER, HID, 100 * l + m); }
    for (int e = 0; e < NE; e++) { L[l].down[e] = buf + per * l + NMAT * gub + db * e; fill(L[l].down[e], HID, INTER, 100 * l + 50 + e); }
  }
  static float xf[HID]; static act_t x; float w[NE];
  for (int i = 0; i < HID; i++) xf[i] = (float)rand() / RAND_MAX * 2 - 1;
  for (int e = 0; e < NE; e++) w[e] = 0.05f + 0.02f * e;
  quantize(xf, HID, &x);
  int maxt = omp_get_max_threads(); if (maxt > MAXT) maxt = MAXT;
  layer(&L[0], &x, w, maxt);
#if defined(GROUPS) || defined(NOGATHER)  // the reference reads this layout; no lookups, no dot
  printf("check: not run with -DGROUPS or -DNOGATHER\n");
#else  // layer 0 against the scalar reference on the same bytes
  double err = 0, mag = 0;
  for (int m = 0; m < NMAT; m++) for (int r = 0; r < INTER; r += 7) {
    double ref = ref_row(L[0].gu[m], INTER, HID, r, &x); err = fmax(err, fabs(ref - gu_out[m * INTER + r])); mag = fmax(mag, fabs(ref)); }
  double derr = 0, dmag = 0;
  for (int r = 0; r < HID; r += 3) { double ref = 0;
    for (int e = 0; e < NE; e++) ref += w[e] * ref_row(L[0].down[e], HID, INTER, r, &hq[e]);
    derr = fmax(derr, fabs(ref - y_out[r])); dmag = fmax(dmag, fabs(ref)); }
  printf("check: gate/up max |err| %.3g of max %.3g; down %.3g of %.3g\n", err, mag, derr, dmag);
#endif
  double bw = stream_read(buf, per * NL, maxt);
  double layer_mb = per / 1e6;
  printf("read bandwidth %d threads: %.1f GB/s; a layer %.2f MB (IQ1_S bytes)\n", maxt, bw, layer_mb);
  int ths[3] = {maxt, maxt / 2, 1};
  for (int ti = 0; ti < 3; ti++) {
    int nt = ths[ti], n = nt == 1 ? 12 : 96;
    double ts[96];
    for (int i = 0; i < 12; i++) layer(&L[i % NL], &x, w, nt);
    memset(phase_t, 0, sizeof phase_t);
    for (int i = 0; i < n; i++) { double t0 = now(); layer(&L[i % NL], &x, w, nt); ts[i] = now() - t0; }
    for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++) if (ts[j] < ts[i]) { double s = ts[i]; ts[i] = ts[j]; ts[j] = s; }
    double med = ts[n / 2];
    printf("threads %2d  layer median %.3f ms (best %.3f)  %.1f GB/s  %.0f%% of read bw  %.0f Gweights/s"
           "  phases ms: gate/up %.3f sum+h %.3f down %.3f sum %.3f\n",
           nt, 1e3 * med, 1e3 * ts[0], layer_mb / 1e3 / med, 100 * layer_mb / 1e3 / med / bw,
           (double)per * 8 / 1.5625 / med / 1e9, 1e3 * phase_t[0] / n, 1e3 * (phase_t[1] - phase_t[0]) / n,
           1e3 * (phase_t[2] - phase_t[1]) / n, 1e3 * (phase_t[3] - phase_t[2]) / n);
  }
  return 0;
}
