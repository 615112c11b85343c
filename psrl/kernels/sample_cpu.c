/* Fused CPU sampling: temperature, softmax, one inverse-CDF draw and the drawn token's log-probability
 * per row.
 *
 * It computes what psrl.engine.sampler does with a dozen tensor operations (scale, log_softmax,
 * exp, a float64 cumulative sum, searchsorted, gather) for rows that need no top-k / top-p
 * truncation, which is how RL rollouts sample. One exp per vocabulary entry: the draw is located
 * in the unnormalised weights exp((x - max) / t), scaled by their float64 total.
 *
 * Built with fast math (vectorised exp), which lets the compiler assume there are no infinities,
 * yet suppressed tokens arrive as -inf. Non-finite logits are therefore recognised from their bits
 * (an integer test the compiler cannot fold away) and get weight 0: such a token is never drawn.
 */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int psrl_sample_abi_version(void) { return 1; }

static inline int is_finite_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7fffffffu) < 0x7f800000u;
}

enum { BLOCK = 64 };

/* The index where the running float64 sum of weights first exceeds target: block sums first (they
 * vectorise), then one block scanned entry by entry. Zero weights are never chosen; should rounding
 * leave the target unreached, the last entry with weight is. */
static int64_t locate(const float *restrict weights, int64_t vocab, double target) {
    double cumulative = 0.0;
    int64_t last = -1;
    for (int64_t start = 0; start < vocab; start += BLOCK) {
        const int64_t end = start + BLOCK < vocab ? start + BLOCK : vocab;
        double block = 0.0;
        for (int64_t j = start; j < end; j++) block += (double)weights[j];
        if (block <= 0.0) continue;
        if (cumulative + block <= target) {
            cumulative += block;
            for (int64_t j = end - 1; j >= start; j--) {
                if (weights[j] > 0.0f) {
                    last = j;
                    break;
                }
            }
            continue;
        }
        for (int64_t j = start; j < end; j++) {
            if (weights[j] <= 0.0f) continue;
            last = j;
            cumulative += (double)weights[j];
            if (cumulative > target) return j;
        }
    }
    return last;
}

/* One row: the token and its log-probability; token -1 when no logit is finite. */
static void sample_row(const float *restrict row, int64_t vocab, float temperature, double uniform,
                       float *restrict weights, int64_t *restrict token_id, float *restrict logprob) {
    const float inverse = temperature > 0.0f ? 1.0f / temperature : 1.0f;
    float peak = -FLT_MAX;
    int64_t num_finite = 0;
    for (int64_t j = 0; j < vocab; j++) {
        const int finite = is_finite_bits(row[j]);
        const float value = finite ? row[j] : -FLT_MAX;
        num_finite += finite;
        peak = value > peak ? value : peak;
    }
    *token_id = -1;
    *logprob = 0.0f;
    if (num_finite == 0) return;
    float total = 0.0f;
    for (int64_t j = 0; j < vocab; j++) {
        weights[j] = is_finite_bits(row[j]) ? expf((row[j] - peak) * inverse) : 0.0f;
        total += weights[j];
    }
    int64_t chosen = 0;
    if (temperature > 0.0f) {
        double mass = 0.0;
        for (int64_t j = 0; j < vocab; j++) mass += (double)weights[j];
        chosen = locate(weights, vocab, uniform * mass);
    } else {
        while (!(is_finite_bits(row[chosen]) && row[chosen] == peak)) chosen++; /* first maximum, as argmax */
    }
    *token_id = chosen;
    *logprob = (row[chosen] - peak) * inverse - logf(total);
}

/* logits [rows, vocab]; temperatures [rows] (0 = greedy); uniforms [rows] in [0, 1), unused by greedy
 * rows. Writes token_ids [rows] and logprobs [rows]: the log-probability of the chosen token under
 * the temperature-scaled distribution (temperature 1 for greedy rows). A row without one finite
 * logit gets token -1. Returns 0, or -1 when scratch memory could not be allocated. */
int psrl_sample(const float *restrict logits, int64_t rows, int64_t vocab, const float *restrict temperatures,
                const double *restrict uniforms, int64_t *restrict token_ids, float *restrict logprobs) {
    int failed = 0;
#pragma omp parallel if (rows * vocab >= 262144) reduction(| : failed)
    {
        float *weights = malloc((size_t)vocab * sizeof(float));
        if (weights == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (weights != NULL)
                sample_row(logits + r * vocab, vocab, temperatures[r], uniforms[r], weights, token_ids + r,
                           logprobs + r);
        }
        free(weights);
    }
    return failed ? -1 : 0;
}
