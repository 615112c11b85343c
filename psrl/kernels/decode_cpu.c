/* Fused fp32 CPU kernels for one decode step of a Llama / Qwen2-family layer.
 *
 * A decode step of a small model on a CPU is bound by how many tensor operations it runs, not by
 * arithmetic: each PyTorch operation costs microseconds of dispatch and threading, and a layer
 * needs about twenty of them besides its four matmuls. These kernels replace everything but the
 * matmuls with three calls per layer:
 *
 *   psrl_rms_norm           RMSNorm (fp32 statistics, then the weight), as the reference models do
 *   psrl_decode_attention   rotary embedding of q and k, the write of the new key/value into the
 *                           paged cache and into the decode workspace, and attention of every
 *                           query head over its sequence's keys
 *   psrl_silu_mul           SwiGLU's silu(gate) * up
 *
 * The decode workspace keeps, per running sequence (row) and kv head, keys and values row-major
 * ([kv_head][position][dim]): a step appends one contiguous vector per head, and attention reads
 * each head's keys and values as two sequential streams. At batch 32 attention is bound by
 * reading those streams from the L3 cache, so the layout is chosen for the memory system, not
 * for arithmetic: keys transposed over the whole row (scores as one vector multiply-add per
 * dimension) made every append touch head_dim distant cache lines, and keys transposed in tiles
 * of 16 positions were still 20-30% slower than plain rows. Every tensor is fp32 and contiguous
 * in the layouts given; the Python side checks that.
 * Built with -O3 -ffast-math -march=native: exp is vectorised through glibc's libmvec. With -fopenmp
 * the library needs libgomp.so.1, which the loader resolves to the copy torch has already loaded,
 * so attention runs on torch's own thread pool (torch.set_num_threads applies) and never adds a
 * second pool competing for the same cores.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE__)
#include <xmmintrin.h>
/* Flush denormals to zero inside a kernel. Softmax weights of far-off positions and their products
 * with values are often denormal, and x86 arithmetic on denormals is about a hundred times slower.
 * The library is linked without -ffast-math (psrl/kernels/build.py), so nothing sets these bits for
 * the whole process; each kernel thread sets them for the kernel's duration and restores the
 * caller's mode on the way out. */
#define DENORMALS_OFF(saved) const unsigned int saved = _mm_getcsr(); _mm_setcsr(saved | 0x8040)
#define DENORMALS_RESTORE(saved) _mm_setcsr(saved)
#else
#define DENORMALS_OFF(saved) (void)0
#define DENORMALS_RESTORE(saved) (void)0
#endif

int psrl_kernels_abi_version(void) { return 2; }

void psrl_rms_norm(const float *restrict x, const float *restrict weight, float *restrict out,
                   int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict in = x + r * dim;
        float *restrict dst = out + r * dim;
        float sum = 0.0f;
        for (int64_t i = 0; i < dim; i++) sum += in[i] * in[i];
        const float inv = 1.0f / sqrtf(sum / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) dst[i] = weight[i] * (in[i] * inv);
    }
}

/* gate_up: [rows, 2 * inter] (gate | up); out: [rows, inter]. */
void psrl_silu_mul(const float *restrict gate_up, float *restrict out, int64_t rows, int64_t inter) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict gate = gate_up + r * 2 * inter;
        const float *restrict up = gate + inter;
        float *restrict dst = out + r * inter;
        for (int64_t i = 0; i < inter; i++) dst[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

typedef struct {
    int64_t num_seqs;     /* batch rows; row b of the workspace belongs to batch row b */
    int64_t num_heads;    /* query heads */
    int64_t num_kv_heads;
    int64_t head_dim;
    int64_t qkv_stride;   /* floats between consecutive rows of qkv */
    int64_t capacity;     /* positions per workspace row */
    float scale;          /* softmax scale, 1/sqrt(head_dim) */
} psrl_decode_shape;

/* Rotate interleaved (real, imaginary) pairs by the complex factors (cos, sin) of one position. */
static void rotate(const float *restrict x, const float *restrict factors, float *restrict out, int64_t dim) {
    for (int64_t i = 0; i < dim; i += 2) {
        const float c = factors[i], s = factors[i + 1];
        out[i] = x[i] * c - x[i + 1] * s;
        out[i + 1] = x[i] * s + x[i + 1] * c;
    }
}

/* Attention of `group` query heads (rows of q, head_dim apart) over the first n keys/values of one
 * kv head. Always inlined, so that the callers below get copies with head_dim a constant: the
 * per-dimension loops are then unrolled and the output accumulators stay in registers. */
static inline __attribute__((always_inline)) void attend(const float *restrict q, const float *restrict keys,
                                                         const float *restrict values, float *restrict out,
                                                         float *restrict scores, int64_t group, int64_t n,
                                                         const int64_t dim, float scale) {
    for (int64_t j = 0; j < n; j++) {
        const float *restrict key = keys + j * dim;
        for (int64_t g = 0; g < group; g++) {
            const float *restrict query = q + g * dim;
            float dot = 0.0f;
            for (int64_t d = 0; d < dim; d++) dot += query[d] * key[d];
            scores[g * n + j] = dot * scale;
        }
    }
    float inverse_totals[group];
    for (int64_t g = 0; g < group; g++) {
        float *restrict row = scores + g * n;
        float peak = row[0];
        for (int64_t j = 1; j < n; j++) peak = row[j] > peak ? row[j] : peak;
        float total = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            row[j] = expf(row[j] - peak);
            total += row[j];
        }
        inverse_totals[g] = 1.0f / total;
    }
    /* one pass over the values for every query head of the group */
    float acc[group * dim];
    for (int64_t i = 0; i < group * dim; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float *restrict value = values + j * dim;
        for (int64_t g = 0; g < group; g++) {
            const float weight = scores[g * n + j];
            for (int64_t d = 0; d < dim; d++) acc[g * dim + d] += weight * value[d];
        }
    }
    for (int64_t g = 0; g < group; g++) {
        for (int64_t d = 0; d < dim; d++) out[g * dim + d] = acc[g * dim + d] * inverse_totals[g];
    }
}

static void attend_any_dim(const float *restrict q, const float *restrict keys, const float *restrict values,
                           float *restrict out, float *restrict scores, int64_t group, int64_t n, int64_t dim,
                           float scale) {
    switch (dim) {
    case 64: attend(q, keys, values, out, scores, group, n, 64, scale); break;
    case 128: attend(q, keys, values, out, scores, group, n, 128, scale); break;
    case 32: attend(q, keys, values, out, scores, group, n, 32, scale); break;
    default: attend(q, keys, values, out, scores, group, n, dim, scale);
    }
}

/* One (sequence, kv head) pair of a decode step; `scratch` holds group * (longest + dim) floats. */
static void decode_pair(const float *restrict qkv, const float *restrict rope, const int64_t *restrict positions,
                        const int64_t *restrict slots, float *restrict cache, float *restrict keys,
                        float *restrict values, float *restrict out, float *restrict scratch, int64_t pair,
                        int64_t longest, const psrl_decode_shape *shape) {
    const int64_t heads = shape->num_heads, kv_heads = shape->num_kv_heads, dim = shape->head_dim;
    const int64_t group = heads / kv_heads, kv_size = kv_heads * dim;
    const int64_t b = pair / kv_heads, h = pair % kv_heads, pos = positions[b];
    const float *restrict row = qkv + b * shape->qkv_stride;
    const float *restrict factors = rope + pos * dim;
    float *restrict q = scratch + group * longest;
    for (int64_t g = 0; g < group; g++) rotate(row + (h * group + g) * dim, factors, q + g * dim, dim);
    float *restrict slot = cache + slots[b] * 2 * kv_size + h * dim;
    float *restrict key = keys + (pair * shape->capacity + pos) * dim;
    rotate(row + heads * dim + h * dim, factors, key, dim);
    memcpy(slot, key, (size_t)dim * sizeof(float));
    memcpy(values + (pair * shape->capacity + pos) * dim, row + heads * dim + kv_size + h * dim,
           (size_t)dim * sizeof(float));
    memcpy(slot + kv_size, row + heads * dim + kv_size + h * dim, (size_t)dim * sizeof(float));
    attend_any_dim(q, keys + pair * shape->capacity * dim, values + pair * shape->capacity * dim,
                   out + (b * heads + h * group) * dim, scratch, group, pos + 1, dim, shape->scale);
}

/* One layer's decode attention for a batch.
 *   qkv:       [num_seqs, qkv_stride]; q heads, then k heads, then v heads (pairs interleaved in q, k)
 *   rope:      [positions, head_dim / 2, 2] (cos, sin)
 *   positions: [num_seqs] position of each new token; its sequence attends to positions 0..p
 *   slots:     [num_seqs] paged-cache slot of each new token
 *   cache:     [slots, 2, num_kv_heads, head_dim] this layer's paged cache (keys, values)
 *   keys:      [rows, num_kv_heads, capacity, head_dim] this layer's workspace keys
 *   values:    [rows, num_kv_heads, capacity, head_dim] this layer's workspace values
 *   out:       [num_seqs, num_heads * head_dim]
 * Returns 0, or -1 when scratch memory could not be allocated (nothing written to out then).
 */
int psrl_decode_attention(const float *restrict qkv, const float *restrict rope, const int64_t *restrict positions,
                          const int64_t *restrict slots, float *restrict cache, float *restrict keys,
                          float *restrict values, float *restrict out, const psrl_decode_shape *shape) {
    const int64_t heads = shape->num_heads, kv_heads = shape->num_kv_heads, dim = shape->head_dim;
    const int64_t num_seqs = shape->num_seqs, group = heads / kv_heads;
    int64_t longest = 0;
    for (int64_t b = 0; b < num_seqs; b++) longest = positions[b] + 1 > longest ? positions[b] + 1 : longest;
    int failed = 0;
    /* Each (sequence, kv head) pair is independent: it rotates its own query heads and key, stores its
     * key/value, and attends. Threads come from torch's OpenMP pool (the same libgomp). */
#pragma omp parallel reduction(| : failed)
    {
        DENORMALS_OFF(saved_mode);
        /* scores, then the pair's rotated query heads */
        float *scratch = malloc((size_t)(group * (longest + dim)) * sizeof(float));
        if (scratch == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < num_seqs * kv_heads; pair++) {
            if (scratch != NULL)
                decode_pair(qkv, rope, positions, slots, cache, keys, values, out, scratch, pair, longest, shape);
        }
        free(scratch);
        DENORMALS_RESTORE(saved_mode);
    }
    return failed ? -1 : 0;
}
