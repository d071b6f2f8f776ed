// llama.cpp's CPU matrix-vector product (ggml's vec_dot kernels) on the i-quants and Q4_K, one
// token, V3 expert shapes: the peer row beside bench_cpu_moe.py's lattice i-quant tiles.
//
// Per type: MATS matrices of [16384 rows (8 experts' gate rows), 7168 columns] of random valid
// blocks (the f16 scales set to a small finite value), together >= 400 MB so the product
// streams from DRAM, times one f32 activation vector, in one graph on a persistent 16-thread
// pool; median of 21 graph runs. GB/s counts the weights' GGUF bytes. Built and run by
// scripts/device_lattice_peer.sh (ggml from ../shared/scripts/llama-cpp-src).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// byte offsets of a block's f16 scale fields (random bytes elsewhere are valid blocks; the same
// offsets as cpu_kernels/random_blocks.py's _F16_FIELDS)
static void fix_scales(enum ggml_type t, uint8_t *blk) {
  const uint16_t d = 0x1c00;  // 2^-8
  switch (t) {
    case GGML_TYPE_Q4_K: memcpy(blk, &d, 2); memcpy(blk + 2, &d, 2); break;
    case GGML_TYPE_IQ1_M: {  // d sits in the top nibbles of the 4 scale words at byte 48
      uint16_t *w = (uint16_t *)(blk + 48);
      for (int m = 0; m < 4; m++) w[m] = (uint16_t)((w[m] & 0x0fff) | (((d >> (4 * m)) & 15) << 12));
      break;
    }
    default: memcpy(blk, &d, 2);  // IQ1_S, IQ2_*, IQ3_*, IQ4_NL, IQ4_XS: d first
  }
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 16;
  const int64_t K = 7168, N = 16384;
  const enum ggml_type types[] = {GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M, GGML_TYPE_IQ2_XXS,
                                  GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS,
                                  GGML_TYPE_IQ3_S, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_NL,
                                  GGML_TYPE_Q4_K};
  ggml_cpu_init();
  struct ggml_threadpool_params tp = ggml_threadpool_params_default(threads);
  struct ggml_threadpool *pool = ggml_threadpool_new(&tp);
  printf("| type | GB of weights | ms (median of 21) | GB/s |\n|---|---|---|---|\n");
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    enum ggml_type t = types[ti];
    size_t mat_bytes = ggml_row_size(t, K) * N;
    int mats = (int)((400e6 + mat_bytes - 1) / mat_bytes);
    struct ggml_init_params ip = {mats * (mat_bytes + 4096) + (64 << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, K);
    for (int64_t i = 0; i < K; i++) ((float *)x->data)[i] = (float)((i * 7919) % 200 - 100) / 100.f;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4 * mats + 16, false);
    srand(1);
    for (int m = 0; m < mats; m++) {
      struct ggml_tensor *w = ggml_new_tensor_2d(ctx, t, K, N);
      uint8_t *p = (uint8_t *)w->data;
      for (size_t i = 0; i < mat_bytes; i++) p[i] = (uint8_t)rand();
      size_t bs = ggml_type_size(t);
      for (size_t o = 0; o < mat_bytes; o += bs) fix_scales(t, p + o);
      ggml_build_forward_expand(gf, ggml_mul_mat(ctx, w, x));
    }
    struct ggml_cplan plan = ggml_graph_plan(gf, threads, pool);
    uint8_t *work = malloc(plan.work_size + 64);
    plan.work_data = work;
    double ms[21];
    for (int r = -2; r < 21; r++) {
      double t0 = now();
      ggml_graph_compute(gf, &plan);
      if (r >= 0) ms[r] = 1e3 * (now() - t0);
    }
    qsort(ms, 21, sizeof ms[0], cmp);
    double gb = (double)mat_bytes * mats / 1e9;
    printf("| %s | %.3f | %.2f | %.1f |\n", ggml_type_name(t), gb, ms[10], gb / (ms[10] / 1e3));
    fflush(stdout);
    free(work);
    ggml_free(ctx);
  }
  ggml_threadpool_free(pool);
  return 0;
}
