/* The genie's floor on one node (dsv4bisect/bisect/plan/exact_floor.py `_genie_value`), the same
 * recursion over the same states, in C: the Python table needs hours for a profile of six
 * candidates, this one minutes. genie_floor.py writes the problem on stdin and checks this
 * program against the Python table on the problems small enough for both.
 *
 * Input (whitespace-separated numbers, as genie_floor.py `problem_text` writes them):
 *   n_sets n_states eps price switch_s launch_s hot good_s bad_s
 *   prior[n_sets]
 *   n_starts starts[n_starts]                    (an engine state, -1: none up)
 *   per set h: rest_nonempty remedy_state remedy_fails   (the bad end without h)
 *   n_tests, per test: state fails remedy_of     (the subsets but the two ends)
 *   n_perms, per perm: tau[n_sets] state_image[n_states]
 * Output: "value <v> states <n>", v the optimum from the ends in the Python function's units.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS 32
#define MAX_TESTS 256
#define MAX_PERMS 1024
#define CHUNK 8
#define N_CHUNKS (MAX_SETS / CHUNK)

typedef uint32_t mask_t;

static int n_sets, n_states, hot, n_starts, n_tests, n_perms, n_chunks;
static double eps, price, switch_s, launch_s, good_s, bad_s, trial_s;
static double prior[MAX_SETS];
static int starts[8];
static int rest_nonempty[MAX_SETS], remedy_state[MAX_SETS];
static mask_t remedy_fails[MAX_SETS];
static int test_state[MAX_TESTS];
static mask_t test_fails[MAX_TESTS], test_remedy_of[MAX_TESTS];
static mask_t (*perm_chunk)[N_CHUNKS][1 << CHUNK]; /* a perm's image of each chunk's bits */
static int (*perm_state)[256];
static double mass_chunk[N_CHUNKS][1 << CHUNK];

/* the table: open addressing on (mask0, mask1, done, up) */
typedef struct { uint64_t k1, k2; double v; } entry_t;
static entry_t *table;
static uint64_t cap, used;
static const uint64_t EMPTY = ~(uint64_t)0;

static uint64_t hash2(uint64_t a, uint64_t b) {
    uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
    h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ULL; h ^= h >> 29;
    return h;
}

static entry_t *slot(uint64_t k1, uint64_t k2) {
    uint64_t i = hash2(k1, k2) & (cap - 1);
    while (table[i].k1 != EMPTY && (table[i].k1 != k1 || table[i].k2 != k2)) i = (i + 1) & (cap - 1);
    return &table[i];
}

static void grow(void) {
    entry_t *old = table;
    uint64_t old_cap = cap;
    cap *= 2;
    table = malloc(cap * sizeof(entry_t));
    if (!table) { fprintf(stderr, "error: out of memory at %llu states\n", (unsigned long long)used); exit(3); }
    memset(table, 0xff, cap * sizeof(entry_t));
    for (uint64_t i = 0; i < old_cap; i++)
        if (old[i].k1 != EMPTY) *slot(old[i].k1, old[i].k2) = old[i];
    free(old);
}

static double mass(mask_t m) {
    double s = 0;
    for (int c = 0; c < n_chunks; c++) s += mass_chunk[c][(m >> (c * CHUNK)) & ((1 << CHUNK) - 1)];
    return s;
}

static double weight(mask_t m0, mask_t m1) { return (1 - eps) * mass(m0) + eps * mass(m1); }

static mask_t image(int p, mask_t m) {
    mask_t out = 0;
    for (int c = 0; c < n_chunks; c++) out |= perm_chunk[p][c][(m >> (c * CHUNK)) & ((1 << CHUNK) - 1)];
    return out;
}

/* the least image under the permutations, ordered as the Python tuple (mask0, mask1, up, done) */
static void canon(mask_t *m0, mask_t *m1, int *up, mask_t *done) {
    mask_t b0 = *m0, b1 = *m1, bd = *done;
    int bu = *up;
    for (int p = 0; p < n_perms; p++) {
        mask_t a0 = image(p, *m0);
        if (a0 > b0) continue;
        mask_t a1 = image(p, *m1);
        if (a0 == b0 && a1 > b1) continue;
        int au = *up >= 0 ? perm_state[p][*up] : *up;
        if (a0 == b0 && a1 == b1 && au > bu) continue;
        mask_t ad = image(p, *done);
        if (a0 == b0 && a1 == b1 && au == bu && ad >= bd) continue;
        b0 = a0; b1 = a1; bu = au; bd = ad;
    }
    *m0 = b0; *m1 = b1; *up = bu; *done = bd;
}

static double engine_s(int up, int state) { return hot && up == state ? switch_s : launch_s; }

static double least(mask_t m0, mask_t m1) {
    mask_t both = m0 | m1;
    if (!both) return 0;
    double heaviest = 0;
    for (int h = 0; h < n_sets; h++)
        if (both >> h & 1) {
            double w = (m0 >> h & 1 ? 1 - eps : eps) * prior[h];
            if (w > heaviest) heaviest = w;
        }
    double total = weight(m0, m1);
    double a = price * (total - heaviest), b = total * trial_s;
    return a < b ? a : b;
}

static double value(mask_t m0, mask_t m1, int up, mask_t done);

typedef struct { double key; int index; } order_t;

static int by_key(const void *a, const void *b) {
    const order_t *x = a, *y = b;
    if (x->key < y->key) return -1;
    if (x->key > y->key) return 1;
    return x->index - y->index; /* stable, as Python's sorted */
}

static double compute(mask_t m0, mask_t m1, int up, mask_t done) {
    mask_t both = m0 | m1;
    double total = weight(m0, m1), best = INFINITY;
    for (int h = 0; h < n_sets; h++) { /* stop, naming h, then its remedy check */
        if (!(both >> h & 1)) continue;
        double wh = (m0 >> h & 1 ? 1 - eps : eps) * prior[h];
        double remedy = 0;
        if (rest_nonempty[h] && !(done >> h & 1)) {
            double engine = engine_s(up, remedy_state[h]);
            for (int g = 0; g < n_sets; g++)
                if (both >> g & 1)
                    remedy += (m0 >> g & 1 ? 1 - eps : eps) * prior[g]
                              * (engine + (remedy_fails[h] >> g & 1 ? bad_s : good_s));
        }
        double cost = price * (total - wh) + remedy;
        if (cost < best) best = cost;
    }
    if ((both & (both - 1)) == 0) return best; /* one set left */
    order_t order[MAX_TESTS];
    for (int t = 0; t < n_tests; t++) {
        order[t].index = t;
        order[t].key = fabs(2 * weight(m0 & test_fails[t], m1 & test_fails[t]) - total)
                       + (engine_s(up, test_state[t]) > switch_s) * total;
    }
    qsort(order, n_tests, sizeof(order_t), by_key);
    for (int o = 0; o < n_tests; o++) {
        int t = order[o].index;
        mask_t fl = test_fails[t];
        mask_t f0 = m0 & fl, f1 = m1 & fl, p0 = m0 & ~fl, p1 = m1 & ~fl;
        mask_t fail0 = f0, fail1 = f1 | p0, pass0 = p0, pass1 = p1 | f0;
        int state = test_state[t];
        mask_t tested = done | (test_remedy_of[t] & both);
        double cost = total * engine_s(up, state) + weight(f0, f1) * bad_s + weight(p0, p1) * good_s;
        int fail_same = fail0 == m0 && fail1 == m1, pass_same = pass0 == m0 && pass1 == m1;
        if (fail_same || pass_same) { /* one outcome gives this belief back */
            if (eps == 0 || cost / eps >= best) continue;
            mask_t o0 = fail_same ? pass0 : fail0, o1 = fail_same ? pass1 : fail1;
            double rest = (1 - eps) * value(o0, o1, state, tested & (o0 | o1));
            double v = (cost + rest) / eps;
            if (v < best) best = v;
            continue;
        }
        double low_fail = least(fail0, fail1), low_pass = least(pass0, pass1);
        if (cost + (1 - eps) * (low_fail + low_pass) >= best) continue;
        if (fail0 | fail1) cost += (1 - eps) * value(fail0, fail1, state, tested & (fail0 | fail1));
        if (cost + (1 - eps) * low_pass >= best) continue;
        if (pass0 | pass1) cost += (1 - eps) * value(pass0, pass1, state, tested & (pass0 | pass1));
        if (cost < best) best = cost;
    }
    return best;
}

static double value(mask_t m0, mask_t m1, int up, mask_t done) {
    if (n_perms) canon(&m0, &m1, &up, &done);
    uint64_t k1 = (uint64_t)m0 << 32 | m1, k2 = (uint64_t)done << 16 | (uint16_t)(up + 1);
    entry_t *e = slot(k1, k2);
    if (e->k1 != EMPTY) return e->v;
    double v = compute(m0, m1, up, done);
    if (2 * (used + 1) > cap) grow();
    e = slot(k1, k2);
    e->k1 = k1; e->k2 = k2; e->v = v;
    used++;
    return v;
}

static void need(int ok) {
    if (!ok) { fprintf(stderr, "error: the problem on stdin is malformed\n"); exit(2); }
}

static long read_int(void) { long x; need(scanf("%ld", &x) == 1); return x; }
static double read_double(void) { double x; need(scanf("%lf", &x) == 1); return x; }

int main(void) {
    n_sets = read_int(); n_states = read_int();
    need(n_sets > 0 && n_sets <= MAX_SETS && n_states > 0 && n_states <= 256);
    eps = read_double(); price = read_double(); switch_s = read_double(); launch_s = read_double();
    hot = read_int(); good_s = read_double(); bad_s = read_double();
    trial_s = switch_s + (good_s < bad_s ? good_s : bad_s); /* the cheapest trial: least's unit */
    for (int h = 0; h < n_sets; h++) prior[h] = read_double();
    n_starts = read_int();
    need(n_starts > 0 && n_starts <= 8);
    for (int i = 0; i < n_starts; i++) starts[i] = read_int();
    for (int h = 0; h < n_sets; h++) {
        rest_nonempty[h] = read_int(); remedy_state[h] = read_int(); remedy_fails[h] = read_int();
    }
    n_tests = read_int();
    need(n_tests > 0 && n_tests <= MAX_TESTS);
    for (int t = 0; t < n_tests; t++) {
        test_state[t] = read_int(); test_fails[t] = read_int(); test_remedy_of[t] = read_int();
    }
    n_perms = read_int();
    need(n_perms >= 0 && n_perms <= MAX_PERMS);
    n_chunks = (n_sets + CHUNK - 1) / CHUNK;
    perm_chunk = calloc(n_perms ? n_perms : 1, sizeof *perm_chunk);
    perm_state = calloc(n_perms ? n_perms : 1, sizeof *perm_state);
    for (int p = 0; p < n_perms; p++) {
        int tau[MAX_SETS];
        for (int h = 0; h < n_sets; h++) { tau[h] = read_int(); need(tau[h] >= 0 && tau[h] < n_sets); }
        for (int s = 0; s < n_states; s++) perm_state[p][s] = read_int();
        for (int c = 0; c < n_chunks; c++)
            for (int v = 0; v < 1 << CHUNK; v++) {
                mask_t out = 0;
                for (int k = 0; k < CHUNK; k++)
                    if (v >> k & 1 && c * CHUNK + k < n_sets) out |= (mask_t)1 << tau[c * CHUNK + k];
                perm_chunk[p][c][v] = out;
            }
    }
    for (int c = 0; c < n_chunks; c++)
        for (int v = 0; v < 1 << CHUNK; v++) {
            double s = 0;
            for (int k = 0; k < CHUNK; k++)
                if (v >> k & 1 && c * CHUNK + k < n_sets) s += prior[c * CHUNK + k];
            mass_chunk[c][v] = s;
        }
    cap = 1 << 20;
    table = malloc(cap * sizeof(entry_t));
    need(table != NULL);
    memset(table, 0xff, cap * sizeof(entry_t));
    mask_t full = n_sets == 32 ? ~(mask_t)0 : ((mask_t)1 << n_sets) - 1;
    double best = INFINITY;
    for (int i = 0; i < n_starts; i++) {
        double v = value(full, 0, starts[i], 0);
        if (v < best) best = v;
    }
    printf("value %.12g states %llu\n", best / (1 - eps), (unsigned long long)used);
    return 0;
}
