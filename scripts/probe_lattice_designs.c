// Probe: decode designs for the lattice i-quants (IQ2_XXS-like: 8-bit codes naming 8-weight grid
// rows, 8 sign bits a run, a 4-bit scale per 32 columns), 1 token, 16 rows x 256 columns a
// block, on Sapphire Rapids. Kernels: "gather" (the layout packed_tiles_grid.py uses: one
// vpgatherqq of 8 rows' grid rows per run of 8 columns), "perm" (per weight position, the 64
// codes of 16 rows x 4 runs looked up in-register with two vpermi2b over 256-byte tables),
// "floor" (the code loads and vpdpbusd alone) and "gather no sign". Rows: L2-resident (the same
// 288 KB per thread again and again) and DRAM (12 matrices of 2048 x 7168 per thread), 1, 8, 16
// threads. Measured 2026-11-26 on the H100 machine (16 threads, L2 / DRAM, G weights/s): gather
// 229-266 / 185-215, perm 216 / 162 (235 / 175 with one vpermi2b instead of two and a blend),
// floor 786-878 / 280-363: the lookups, not the bytes, set the pace, and in-register tables are
// no cheaper than gathers there.
// gcc -O3 -march=sapphirerapids -fopenmp probe_lattice_designs.c -o p && OMP_PROC_BIND=spread ./p
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static uint64_t grid2[256];      // IQ2_XXS-like grid rows (8 bytes each)
static uint32_t grid1[2048];     // IQ1-like 16-bit entries in 32-bit slots
static uint8_t tabs[8][256];     // per-position byte tables (C + g)

#define N_ITERS 20000000L

__attribute__((noinline)) double ghz(void) {
  long n = 200000000L; long a = 1, b = 3;
  double t = now();
  for (long i = 0; i < n; i++) { __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(a) : "r"(b)); }
  t = now() - t;
  return 4.0 * n / t / 1e9;
}
// ---- IQ2_XXS-like kernels over a buffer: 16 rows x 256 cols per block, 1 token ----
// gather design (today's): per block per 8-row group: 32 runs: codes [32][8], signs [32][8] (u8 bitmask per run/row)
// scales ignored beyond one fma per sub-block (same in both designs)
#define GBLOCK 1152  // 16 rows: (256 codes + 256 signs + 64 scales + 64 d) x 2 groups -> we use 1152 per 16 rows

// the per-32-column epilogue all designs share: (acc - offset) * scale into facc
static inline __m512 scale_add(__m512 facc, __m512i acc, const uint8_t *sc_at, int32_t offset) {
  __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc_at));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(offset))),
                         _mm512_cvtepi32_ps(sc), facc);
}

static inline void prefetch_block(const uint8_t *p) {
  for (int l = 0; l < GBLOCK; l += 64) _mm_prefetch((const char *)p + 2432 + l, _MM_HINT_T0);
}

// signs: 0 leaves the weights' signs out (what they cost); inlined per value by its callers
static inline float k_gather(const uint8_t *buf, long nblocks, const int8_t *x, int signs) {
  __m512 facc = _mm512_setzero_ps();
  const __m512i C = _mm512_set1_epi8(64);
  for (long b = 0; b < nblocks; b++) {
    const uint8_t *p = buf + b * GBLOCK;  // group a at p, group b at p + 576
    prefetch_block(p);
    for (int s = 0; s < 8; s++) {
      __m512i acca = _mm512_setzero_si512(), accb = _mm512_setzero_si512();
      for (int q = 0; q < 4; q++) {
        int k = 4 * s + q;
        __m512i xb = _mm512_set1_epi64(*(const long long *)(x + 32 * s + 8 * q));
        for (int g = 0; g < 2; g++) {
          const uint8_t *pg = p + g * 576;
          __m512i idx = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(pg + 8 * k)));
          __m512i w = _mm512_i64gather_epi64(idx, (const long long *)grid2, 8);
          if (signs) {
            __mmask64 neg = _load_mask64((__mmask64 *)(pg + 256 + 8 * k));
            w = _mm512_mask_sub_epi8(_mm512_add_epi8(C, w), neg, C, w);
          }
          if (g == 0) acca = _mm512_dpbusd_epi32(acca, w, xb); else accb = _mm512_dpbusd_epi32(accb, w, xb);
        }
      }
      facc = scale_add(facc, acca, p + 512 + 8 * (s & 3), x[s]);
      facc = scale_add(facc, accb, p + 512 + 8 * (s & 3), x[s]);
    }
  }
  return _mm512_reduce_add_ps(facc);
}

// perm design: per 16 rows per sub-block: codes zmm [16 rows][4 runs] (64 B), signs [8 pos] x u64
// (64 B); per block 8 x 128 = 1024 B + scales 64 + d 64 = 1152. Per weight position j, the 64
// codes' byte j from a 256-byte table: two vpermi2b (low and high 128 entries) and a blend.
// lookup: 0 feeds the codes to vpdpbusd as they are, no table, no sign (the floor: the loads
// and the products alone)
static inline float k_perm(const uint8_t *buf, long nblocks, const int32_t *xp, int lookup) {
  __m512 facc = _mm512_setzero_ps();
  const __m512i C2 = _mm512_set1_epi8(-128);
  for (long b = 0; b < nblocks; b++) {
    const uint8_t *p = buf + b * GBLOCK;
    prefetch_block(p);
    for (int s = 0; s < 8; s++) {
      const uint8_t *ps = p + 128 * s;
      __m512i codes = _mm512_loadu_si512(ps);
      __mmask64 hi = _mm512_movepi8_mask(codes);
      __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; j++) {
        __m512i w = _mm512_and_si512(codes, _mm512_set1_epi8(0x3f));
        if (lookup) {
          __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(tabs[j]), codes, _mm512_loadu_si512(tabs[j] + 64));
          __m512i h2 = _mm512_permutex2var_epi8(_mm512_loadu_si512(tabs[j] + 128), codes, _mm512_loadu_si512(tabs[j] + 192));
          w = _mm512_mask_blend_epi8(hi, lo, h2);
          w = _mm512_mask_sub_epi8(w, _load_mask64((__mmask64 *)(ps + 64 + 8 * j)), C2, w);
        }
        acc = _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(xp[8 * s + j]));
      }
      __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 1024 + 8 * (s & 3))));
      facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(xp[s]))), _mm512_cvtepi32_ps(sc), facc);
    }
  }
  return _mm512_reduce_add_ps(facc);
}

__attribute__((noinline)) float k_gather_signed(const uint8_t *buf, long nb, const int8_t *x) {
  return k_gather(buf, nb, x, 1);
}

__attribute__((noinline)) float k_gather_nosign(const uint8_t *buf, long nb, const int8_t *x) {
  return k_gather(buf, nb, x, 0);
}

__attribute__((noinline)) float k_perm_blend(const uint8_t *buf, long nb, const int32_t *xp) {
  return k_perm(buf, nb, xp, 1);
}

__attribute__((noinline)) float k_floor(const uint8_t *buf, long nb, const int32_t *xp) {
  return k_perm(buf, nb, xp, 0);
}

typedef float (*kern_t)(const uint8_t *, long, const void *);

static float run_kernel(int which, const uint8_t *buf, long nb, const int8_t *x, const int32_t *xp) {
  switch (which) {
    case 1: return k_gather_signed(buf, nb, x);
    case 3: return k_perm_blend(buf, nb, xp);
    case 4: return k_floor(buf, nb, xp);
    default: return k_gather_nosign(buf, nb, x);
  }
}

int main(int argc, char **argv) {
  srand(1);
  for (int i = 0; i < 256; i++) { uint64_t v = 0; for (int j = 0; j < 8; j++) v |= (uint64_t)(8 + 17 * (rand() % 3)) << (8 * j); grid2[i] = v; }
  for (int i = 0; i < 2048; i++) grid1[i] = rand() & 0xffff;
  for (int j = 0; j < 8; j++) for (int i = 0; i < 256; i++) tabs[j][i] = 64 + 8 + 17 * (rand() % 3);
  int8_t x[7168]; int32_t xp[7168 / 4];
  for (int i = 0; i < 7168; i++) x[i] = rand() % 200 - 100;
  memcpy(xp, x, 7168);
  // one expert-like matrix per thread: 2048 rows x 7168 cols -> 128 row-pairs x 28 blocks
  long rows16 = 128, blocks_per_row16 = 28;
  long nb = rows16 * blocks_per_row16;  // blocks per thread
  int maxt = omp_get_max_threads();
  long per_thread_bytes = nb * GBLOCK * 12;  // 12 matrices per thread (> LLC share)
  uint8_t *buf = aligned_alloc(64, per_thread_bytes * maxt);
#pragma omp parallel for
  for (long i = 0; i < per_thread_bytes * maxt; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
  const char *names[6] = {"", "gather (today)", "", "perm 2+blend", "floor dpbusd", "gather no sign"};
  printf("GHz (1 thread, dependent adds): %.2f\n", ghz());
  int threads[3] = {1, maxt / 2, maxt};
  for (int l2 = 1; l2 >= 0; l2--)
  for (int ti = 0; ti < 3; ti++) {
    int nt = threads[ti];
    long nbm = l2 ? 256 : nb;   /* 256 blocks = 288 KB per call: L2-resident */
    int mats = l2 ? 400 : 12;
    for (int which = 1; which < 6; which += which == 1 ? 2 : 1) {
      double best = 1e9;
      for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
#pragma omp parallel num_threads(nt)
        {
          int id = omp_get_thread_num();
          const uint8_t *mine = buf + per_thread_bytes * id;
          volatile float r = 0;
          for (int m = 0; m < mats; m++) r += run_kernel(which, mine + (l2 ? 0 : m * nb * GBLOCK), nbm, x, xp);
        }
        double t = now() - t0;
        if (t < best) best = t;
      }
      double bytes = (double)nbm * GBLOCK * mats * nt;
      double weights = (double)nbm * 4096 * mats * nt;
      printf("%s threads %2d  %-16s  %7.2f GB/s packed  %7.2f Gweights/s  (IQ2_XXS GGUF-equivalent %6.2f GB/s)\n",
             l2 ? "L2  " : "DRAM", nt, names[which], bytes / best / 1e9, weights / best / 1e9, weights * 2.0625 / 8 / best / 1e9);
    }
  }
  return 0;
}
