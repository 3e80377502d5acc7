/* Task Bench (Slaughter et al., SC'20) on StarPU, measured exactly the way
 * `xpu bench scheduler` measures the xpu scheduler (src/cli/sched_bench/), so that
 * benches/starpu/compare.sh can put the two side by side.
 *
 * The same graph: Task Bench's dependency patterns, re-implemented here from
 * src/cli/sched_bench/patterns.rs (same rows, same dependencies, sorted and without
 * duplicates, same splitmix64 draws for random_nearest, same FNV-1a graph digest).
 * The same tasks: one per (step, point), inserted row by row with starpu_task_insert;
 * double-buffered data, one 16-byte variable handle (starpu_variable_data_register) per
 * point and step parity; a task reads its dependencies' handles (STARPU_R) and writes
 * its own (STARPU_W), so StarPU's sequential consistency infers the same edges as xpu's;
 * `trivial` tasks touch no data. Each task spins GRAIN microseconds on the CPU clock,
 * then writes (step u32, point u32, checksum u64); with --check it first verifies each
 * input and counts mismatches in `wrong`, plus tasks run other than once and wrong
 * final values.
 * The same timing: one warm-up run, then ITERATIONS runs from the first insert to the
 * end of starpu_task_wait_for_all; median and best; per_task_ns = median / tasks;
 * efficiency = tasks * grain / (wall * workers); METG(50%) searched from 1000 us by
 * halving (doubling up to 4 ms when 1000 us is below 50%), then 4 geometric
 * bisections, each probe a full measurement.
 *
 * --overhead N instead measures StarPU's tasks_overhead figure: N empty tasks without
 * data or arguments, created with starpu_task_create before timing, submitted, then
 * waited for; it prints the submit time and the submit-to-completion time per task.
 *
 * Workers: StarPU's CPU workers as STARPU_NCPU sets them (compare.sh sets it to the
 * number of xpu host devices); no CUDA or OpenCL workers. Prints one JSON object.
 *
 *   taskbench --pattern P --width W --steps S [--grain-us G] [--iterations N] [--check]
 *             [--metg] [--policy NAME] [--radix R] [--period P] [--fraction F] [--seed X]
 *   taskbench --overhead N [--iterations N] [--policy NAME]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starpu.h>

/* ------------------------------------------------------------------ patterns -- */

enum kind {
  TRIVIAL,
  NO_COMM,
  STENCIL_1D,
  STENCIL_1D_PERIODIC,
  DOM,
  TREE,
  FFT,
  ALL_TO_ALL,
  NEAREST,
  SPREAD,
  RANDOM_NEAREST,
  KINDS
};

static const char *const kind_names[KINDS] = {
    "trivial", "no_comm", "stencil_1d", "stencil_1d_periodic", "dom",           "tree",
    "fft",     "all_to_all", "nearest", "spread",              "random_nearest"};

struct graph {
  enum kind kind;
  uint64_t width, steps, radix, period, seed;
  double fraction;
};

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Row `step`: points [*lo, *hi). */
static void points(const struct graph *g, uint64_t step, uint64_t *lo, uint64_t *hi) {
  uint64_t w = g->width;
  *lo = *hi = 0;
  if (step >= g->steps) return;
  if (g->kind == DOM) {
    uint64_t width = min_u64(min_u64(w, step + 1), g->steps - step);
    uint64_t offset = step + w > g->steps ? step + w - g->steps : 0;
    *lo = offset;
    *hi = offset + width;
  } else if (g->kind == TREE) {
    *hi = step >= 63 ? w : min_u64(w, UINT64_C(1) << step);
  } else {
    *hi = w;
  }
}

static uint64_t mix(uint64_t z) {
  z += UINT64_C(0x9E3779B97F4A7C15);
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

static double uniform(uint64_t seed, uint64_t radix, uint64_t dset, uint64_t dep, uint64_t point) {
  uint64_t v[4] = {radix, dset, dep, point};
  uint64_t h = mix(seed);
  for (int i = 0; i < 4; i++) h = mix(h ^ v[i]);
  return (double)(h >> 11) / (double)(UINT64_C(1) << 53);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Room deps() needs in its output array. */
static size_t deps_capacity(const struct graph *g) {
  return (size_t)(g->width > g->radix ? g->width : g->radix) + 3;
}

/* The points of row step-1 that task (step, point) depends on, ascending, without
 * duplicates; `out` holds deps_capacity() entries. */
static size_t deps(const struct graph *g, uint64_t step, uint64_t point, uint64_t *out) {
  uint64_t lo, hi, w = g->width, p = point;
  size_t n = 0;
  points(g, step, &lo, &hi);
  if (step == 0 || p < lo || p >= hi) return 0;
  switch (g->kind) {
  case TRIVIAL:
    break;
  case NO_COMM:
    out[n++] = p;
    break;
  case STENCIL_1D:
  case STENCIL_1D_PERIODIC:
    for (uint64_t d = p ? p - 1 : 0; d <= min_u64(p + 1, w - 1); d++) out[n++] = d;
    if (g->kind == STENCIL_1D_PERIODIC) {
      if (p == 0) out[n++] = w - 1;
      if (p + 1 >= w) out[n++] = 0;
    }
    break;
  case DOM:
    out[n++] = p ? p - 1 : 0;
    out[n++] = p;
    break;
  case TREE:
    out[n++] = p / 2;
    break;
  case FFT: {
    uint64_t levels = w > 1 ? (uint64_t)(64 - __builtin_clzll(w - 1)) : 1;
    uint64_t k = (step + levels - 1) % levels;
    uint64_t d = k < 64 ? UINT64_C(1) << k : UINT64_MAX;
    if (p >= d) out[n++] = p - d;
    out[n++] = p;
    if (p + d > p && p + d < w) out[n++] = p + d;
    break;
  }
  case ALL_TO_ALL:
    for (uint64_t d = 0; d < w; d++) out[n++] = d;
    break;
  case NEAREST:
  case RANDOM_NEAREST:
    if (g->radix > 0) {
      uint64_t first = p > g->radix / 2 ? p - g->radix / 2 : 0;
      uint64_t last = min_u64(p + (g->radix - 1) / 2, w - 1);
      uint64_t dset = g->kind == RANDOM_NEAREST ? step % g->period : 0;
      for (uint64_t d = first; d <= last; d++) {
        if (g->kind == NEAREST || d == p ||
            uniform(g->seed, g->radix, dset, d, p) < g->fraction)
          out[n++] = d;
      }
    }
    break;
  case SPREAD: {
    uint64_t dset = step % g->period;
    for (uint64_t i = 0; i < g->radix; i++) {
      unsigned __int128 spread = ((unsigned __int128)i * w) / g->radix;
      unsigned __int128 d = ((unsigned __int128)p + spread + (i > 0 ? dset : 0)) % w;
      out[n++] = (uint64_t)d;
    }
    break;
  }
  default:
    break;
  }
  /* Within the previous row, sorted, once each. */
  uint64_t plo, phi;
  points(g, step - 1, &plo, &phi);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (out[i] >= plo && out[i] < phi) out[kept++] = out[i];
  qsort(out, kept, sizeof *out, cmp_u64);
  n = 0;
  for (size_t i = 0; i < kept; i++)
    if (n == 0 || out[n - 1] != out[i]) out[n++] = out[i];
  return n;
}

static void fnv_word(uint64_t *h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    *h ^= (v >> (8 * i)) & 0xff;
    *h *= UINT64_C(0x100000001B3);
  }
}

static uint64_t tasks_of(const struct graph *g) {
  uint64_t n = 0, lo, hi;
  for (uint64_t t = 0; t < g->steps; t++) {
    points(g, t, &lo, &hi);
    n += hi - lo;
  }
  return n;
}

static void edges_and_digest(const struct graph *g, uint64_t *edges, uint64_t *digest, uint64_t *buf) {
  uint64_t lo, hi, h = UINT64_C(0xCBF29CE484222325);
  *edges = 0;
  for (uint64_t t = 0; t < g->steps; t++) {
    points(g, t, &lo, &hi);
    for (uint64_t p = lo; p < hi; p++) {
      size_t n = deps(g, t, p, buf);
      *edges += n;
      fnv_word(&h, t);
      fnv_word(&h, p);
      fnv_word(&h, n);
      for (size_t i = 0; i < n; i++) fnv_word(&h, buf[i]);
    }
  }
  *digest = h;
}

/* --------------------------------------------------------------------- tasks -- */

#define OUTPUT_BYTES 16

static struct graph G;
static int check;
static uint64_t grain_ns;
static uint64_t wrong, ran; /* updated with __atomic builtins */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void spin(uint64_t ns) {
  if (ns == 0) return;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  do {
    clock_gettime(CLOCK_MONOTONIC, &b);
  } while ((uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec - (uint64_t)a.tv_nsec < ns);
}

static void encode(unsigned char *out, uint64_t step, uint64_t point) {
  uint32_t s = (uint32_t)step, p = (uint32_t)point;
  uint64_t c = mix((step << 32) | point);
  for (int i = 0; i < 4; i++) out[i] = (unsigned char)(s >> (8 * i));
  for (int i = 0; i < 4; i++) out[4 + i] = (unsigned char)(p >> (8 * i));
  for (int i = 0; i < 8; i++) out[8 + i] = (unsigned char)(c >> (8 * i));
}

static int encodes(const unsigned char *bytes, uint64_t step, uint64_t point) {
  unsigned char want[OUTPUT_BYTES];
  encode(want, step, point);
  return memcmp(bytes, want, OUTPUT_BYTES) == 0;
}

static void task_func(void *buffers[], void *cl_arg) {
  uint64_t step, point;
  starpu_codelet_unpack_args(cl_arg, &step, &point);
  unsigned n = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());
  unsigned inputs = G.kind == TRIVIAL ? n : n - 1;
  spin(grain_ns);
  if (check) {
    __atomic_fetch_add(&ran, 1, __ATOMIC_RELAXED);
    uint64_t *want = malloc(deps_capacity(&G) * sizeof *want);
    uint64_t bad = 0;
    if (!want) {
      bad = 1;
    } else {
      size_t k = deps(&G, step, point, want);
      bad += k != inputs;
      for (size_t i = 0; i < k && i < inputs; i++)
        bad += !encodes((const unsigned char *)STARPU_VARIABLE_GET_PTR(buffers[i]), step - 1, want[i]);
      free(want);
    }
    if (bad) __atomic_fetch_add(&wrong, bad, __ATOMIC_RELAXED);
  }
  if (G.kind != TRIVIAL) encode((unsigned char *)STARPU_VARIABLE_GET_PTR(buffers[inputs]), step, point);
}

static void empty_func(void *buffers[], void *cl_arg) {
  (void)buffers;
  (void)cl_arg;
}

/* One codelet (and, for model-based policies, one history model) per grain, so that
 * the models of different grains differ, as xpu names its codelets per grain. */
#define MAX_CODELETS 64
static struct starpu_codelet codelets[MAX_CODELETS];
static struct starpu_perfmodel models[MAX_CODELETS];
static char symbols[MAX_CODELETS][64];
static int ncodelets;
static const char *policy = "eager";

static struct starpu_codelet *codelet_for_grain(uint64_t ns) {
  if (ncodelets == MAX_CODELETS) {
    fprintf(stderr, "taskbench: too many grains\n");
    exit(1);
  }
  struct starpu_codelet *cl = &codelets[ncodelets];
  starpu_codelet_init(cl);
  cl->where = STARPU_CPU;
  cl->cpu_funcs[0] = task_func;
  cl->nbuffers = STARPU_VARIABLE_NBUFFERS;
  cl->name = "taskbench";
  if (strncmp(policy, "dm", 2) == 0 || strcmp(policy, "heft") == 0) {
    struct starpu_perfmodel *m = &models[ncodelets];
    snprintf(symbols[ncodelets], sizeof symbols[0], "xpu_taskbench_%s_%" PRIu64 "ns", kind_names[G.kind], ns);
    m->type = STARPU_HISTORY_BASED;
    m->symbol = symbols[ncodelets];
    cl->model = m;
  }
  ncodelets++;
  return cl;
}

static starpu_data_handle_t *handles[2];
static uint64_t *depbuf;

/* One run of the graph; returns the seconds from the first insert to the end of the wait. */
static double run_once(struct starpu_codelet *cl, uint64_t tasks) {
  uint64_t ran_before = __atomic_load_n(&ran, __ATOMIC_RELAXED);
  struct starpu_data_descr *descr = malloc(deps_capacity(&G) * sizeof *descr);
  if (!descr) {
    fprintf(stderr, "taskbench: out of memory\n");
    exit(1);
  }
  double start = now_s();
  for (uint64_t step = 0; step < G.steps; step++) {
    uint64_t lo, hi;
    points(&G, step, &lo, &hi);
    for (uint64_t p = lo; p < hi; p++) {
      size_t n = deps(&G, step, p, depbuf);
      int nd = 0;
      if (G.kind != TRIVIAL) {
        for (size_t i = 0; i < n; i++) {
          descr[nd].handle = handles[(step + 1) % 2][depbuf[i]];
          descr[nd++].mode = STARPU_R;
        }
        descr[nd].handle = handles[step % 2][p];
        descr[nd++].mode = STARPU_W;
      }
      int ret = starpu_task_insert(cl, STARPU_DATA_MODE_ARRAY, descr, nd, STARPU_VALUE, &step, sizeof step,
                                   STARPU_VALUE, &p, sizeof p, 0);
      if (ret != 0) {
        fprintf(stderr, "taskbench: starpu_task_insert failed: %s\n", strerror(-ret));
        exit(1);
      }
    }
  }
  starpu_task_wait_for_all();
  double wall = now_s() - start;
  free(descr);
  if (check) {
    uint64_t r = __atomic_load_n(&ran, __ATOMIC_RELAXED) - ran_before;
    uint64_t bad = r > tasks ? r - tasks : tasks - r;
    if (G.kind != TRIVIAL) {
      uint64_t last = G.steps - 1, lo, hi;
      points(&G, last, &lo, &hi);
      for (uint64_t p = lo; p < hi; p++) {
        starpu_data_handle_t h = handles[last % 2][p];
        starpu_data_acquire(h, STARPU_R);
        bad += !encodes((const unsigned char *)starpu_variable_get_local_ptr(h), last, p);
        starpu_data_release(h);
      }
    }
    __atomic_fetch_add(&wrong, bad, __ATOMIC_RELAXED);
  }
  return wall;
}

struct measured {
  double grain_us, wall_s, wall_best_s, efficiency, granularity_us;
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static unsigned workers;

static struct measured measure(double grain_us, int iterations, uint64_t tasks) {
  struct starpu_codelet *cl = codelet_for_grain((uint64_t)llround(grain_us * 1000.0));
  grain_ns = (uint64_t)llround(grain_us * 1000.0);
  double *walls = malloc(sizeof(double) * (size_t)iterations);
  if (!walls) exit(1);
  run_once(cl, tasks);
  for (int i = 0; i < iterations; i++) walls[i] = run_once(cl, tasks);
  qsort(walls, (size_t)iterations, sizeof(double), cmp_double);
  struct measured m = {grain_us, walls[iterations / 2], walls[0], 0, 0};
  m.efficiency = m.wall_s > 0 ? (double)tasks * grain_us * 1e-6 / (m.wall_s * workers) : 0;
  m.granularity_us = m.wall_s * workers / (double)tasks * 1e6;
  free(walls);
  return m;
}

static void print_measured(const struct measured *m) {
  printf("{\"grain_us\": %.6g, \"wall_s\": %.9g, \"wall_best_s\": %.9g, \"efficiency\": %.6g, "
         "\"granularity_us\": %.6g}",
         m->grain_us, m->wall_s, m->wall_best_s, m->efficiency, m->granularity_us);
}

/* ---------------------------------------------------------------------- main -- */

static void usage(void) {
  fprintf(stderr, "usage: taskbench --pattern P --width W --steps S [--grain-us G] [--iterations N] [--check]\n"
                  "                 [--metg] [--policy NAME] [--radix R] [--period P] [--fraction F] [--seed X]\n"
                  "       taskbench --overhead N [--iterations N] [--policy NAME]\n");
}

static int bad(const char *what, const char *value) {
  fprintf(stderr, "taskbench: %s, not `%s'\n", what, value);
  usage();
  return 2;
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s == '-') return 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || end == s || v < min || v > max) return 0;
  *out = v;
  return 1;
}

static int overhead(uint64_t n, int iterations) {
  static struct starpu_codelet empty;
  starpu_codelet_init(&empty);
  empty.where = STARPU_CPU;
  empty.cpu_funcs[0] = empty_func;
  empty.nbuffers = 0;
  empty.name = "empty";
  struct starpu_task **tasks = malloc(sizeof(*tasks) * n);
  double *submit = malloc(sizeof(double) * (size_t)(iterations + 1));
  double *total = malloc(sizeof(double) * (size_t)(iterations + 1));
  if (!tasks || !submit || !total) return 1;
  for (int it = 0; it <= iterations; it++) { /* the first is the warm-up */
    for (uint64_t i = 0; i < n; i++) {
      tasks[i] = starpu_task_create();
      tasks[i]->cl = &empty;
    }
    double start = now_s();
    for (uint64_t i = 0; i < n; i++) {
      int ret = starpu_task_submit(tasks[i]);
      if (ret != 0) {
        fprintf(stderr, "taskbench: starpu_task_submit failed: %s\n", strerror(-ret));
        return 1;
      }
    }
    double submitted = now_s();
    starpu_task_wait_for_all();
    double end = now_s();
    submit[it] = submitted - start;
    total[it] = end - start;
  }
  qsort(submit + 1, (size_t)iterations, sizeof(double), cmp_double);
  qsort(total + 1, (size_t)iterations, sizeof(double), cmp_double);
  printf("{\"system\": \"starpu\", \"version\": \"%d.%d.%d\", \"overhead_tasks\": %" PRIu64
         ", \"workers\": %u, \"policy\": \"%s\", \"iterations\": %d, \"submit_ns\": %.6g, \"per_task_ns\": %.6g}\n",
         STARPU_MAJOR_VERSION, STARPU_MINOR_VERSION, STARPU_RELEASE_VERSION, n, workers, policy, iterations,
         submit[1 + iterations / 2] / (double)n * 1e9, total[1 + iterations / 2] / (double)n * 1e9);
  free(tasks);
  free(submit);
  free(total);
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"pattern", required_argument, 0, 'p'}, {"width", required_argument, 0, 'w'},
      {"steps", required_argument, 0, 's'},   {"grain-us", required_argument, 0, 'g'},
      {"iterations", required_argument, 0, 'i'}, {"check", no_argument, 0, 'c'},
      {"metg", no_argument, 0, 'm'},          {"policy", required_argument, 0, 'P'},
      {"radix", required_argument, 0, 'r'},   {"period", required_argument, 0, 'T'},
      {"fraction", required_argument, 0, 'f'}, {"seed", required_argument, 0, 'S'},
      {"overhead", required_argument, 0, 'o'}, {0, 0, 0, 0}};
  int have_pattern = 0, metg = 0;
  uint64_t iterations = 5, overhead_tasks = 0;
  double grain_us = 0;
  G.width = G.steps = 0;
  G.radix = 3;
  G.period = 3;
  G.fraction = 0.25;
  G.seed = 0;
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    char *end;
    switch (c) {
    case 'p':
      for (int k = 0; k < KINDS; k++)
        if (strcmp(optarg, kind_names[k]) == 0) {
          G.kind = (enum kind)k;
          have_pattern = 1;
        }
      if (!have_pattern) return bad("unknown pattern", optarg);
      break;
    case 'w':
      if (!parse_u64(optarg, 1, 1 << 20, &G.width)) return bad("the width must be between 1 and 1048576", optarg);
      break;
    case 's':
      if (!parse_u64(optarg, 1, UINT32_MAX, &G.steps)) return bad("the number of steps must be at least 1", optarg);
      break;
    case 'g':
      grain_us = strtod(optarg, &end);
      if (*end || !(grain_us >= 0 && grain_us <= 1e7)) return bad("the grain must be between 0 and 1e7 us", optarg);
      break;
    case 'i':
      if (!parse_u64(optarg, 1, 1000000, &iterations)) return bad("the iterations must be at least 1", optarg);
      break;
    case 'c':
      check = 1;
      break;
    case 'm':
      metg = 1;
      break;
    case 'P':
      policy = optarg;
      break;
    case 'r':
      if (!parse_u64(optarg, 0, 1 << 20, &G.radix)) return bad("the radix must be between 0 and 1048576", optarg);
      break;
    case 'T':
      if (!parse_u64(optarg, 1, UINT32_MAX, &G.period)) return bad("the period must be at least 1", optarg);
      break;
    case 'f':
      G.fraction = strtod(optarg, &end);
      if (*end || !(G.fraction >= 0 && G.fraction <= 1)) return bad("the fraction must be between 0 and 1", optarg);
      break;
    case 'S':
      if (!parse_u64(optarg, 0, UINT64_MAX, &G.seed)) return bad("the seed must be a whole number", optarg);
      break;
    case 'o':
      if (!parse_u64(optarg, 1, UINT32_MAX, &overhead_tasks)) return bad("--overhead needs a task count", optarg);
      break;
    default:
      usage();
      return 2;
    }
  }
  if (optind != argc || (!overhead_tasks && (!have_pattern || !G.width || !G.steps))) {
    usage();
    return 2;
  }

  struct starpu_conf conf;
  starpu_conf_init(&conf);
  conf.ncuda = 0;
  conf.nopencl = 0;
  conf.sched_policy_name = policy;
  int ret = starpu_init(&conf);
  if (ret != 0) {
    fprintf(stderr, "taskbench: starpu_init failed: %s\n", strerror(-ret));
    return 1;
  }
  workers = starpu_cpu_worker_get_count();
  if (workers == 0) {
    fprintf(stderr, "taskbench: StarPU started no CPU worker (STARPU_NCPU=0?)\n");
    starpu_shutdown();
    return 1;
  }
  if (overhead_tasks) {
    ret = overhead(overhead_tasks, (int)iterations);
    starpu_shutdown();
    return ret;
  }

  uint64_t tasks = tasks_of(&G), edges, digest;
  depbuf = malloc(deps_capacity(&G) * sizeof *depbuf);
  unsigned char *data = calloc(2 * G.width, OUTPUT_BYTES);
  handles[0] = calloc(G.width, sizeof(starpu_data_handle_t));
  handles[1] = calloc(G.width, sizeof(starpu_data_handle_t));
  if (!depbuf || !data || !handles[0] || !handles[1]) {
    fprintf(stderr, "taskbench: out of memory\n");
    return 1;
  }
  edges_and_digest(&G, &edges, &digest, depbuf);
  if (G.kind != TRIVIAL)
    for (int parity = 0; parity < 2; parity++)
      for (uint64_t p = 0; p < G.width; p++)
        starpu_variable_data_register(&handles[parity][p], STARPU_MAIN_RAM,
                                      (uintptr_t)(data + (parity * G.width + p) * OUTPUT_BYTES), OUTPUT_BYTES);

  struct measured main_m = measure(grain_us, (int)iterations, tasks);
  struct measured probes[64];
  int nprobes = 0, found = -1;
  if (metg) {
    const double floor_us = 1.0 / 16.0, ceiling_us = 4000.0;
    double g = 1000.0, below = -1;
    probes[nprobes++] = measure(g, (int)iterations, tasks);
    if (probes[0].efficiency >= 0.5) {
      found = 0;
      while (g / 2 >= floor_us) {
        g /= 2;
        probes[nprobes] = measure(g, (int)iterations, tasks);
        if (probes[nprobes].efficiency >= 0.5) {
          found = nprobes++;
        } else {
          nprobes++;
          below = g;
          break;
        }
      }
    } else {
      below = g;
      while (g * 2 <= ceiling_us) {
        g *= 2;
        probes[nprobes] = measure(g, (int)iterations, tasks);
        if (probes[nprobes].efficiency >= 0.5) {
          found = nprobes++;
          break;
        }
        nprobes++;
        below = g;
      }
    }
    if (found >= 0 && below > 0) {
      for (int i = 0; i < 4; i++) {
        double mid = sqrt(probes[found].grain_us * below);
        probes[nprobes] = measure(mid, (int)iterations, tasks);
        if (probes[nprobes].efficiency >= 0.5)
          found = nprobes;
        else
          below = mid;
        nprobes++;
      }
    }
  }

  printf("{\"system\": \"starpu\", \"version\": \"%d.%d.%d\", \"pattern\": \"%s\", \"width\": %" PRIu64
         ", \"steps\": %" PRIu64 ", \"workers\": %u, \"policy\": \"%s\", \"tasks\": %" PRIu64 ", \"edges\": %" PRIu64
         ", \"digest\": \"%016" PRIx64 "\", \"grain_us\": %.6g, \"iterations\": %" PRIu64
         ", \"wall_stat\": \"median\", \"wall_s\": %.9g, \"wall_best_s\": %.9g, \"per_task_ns\": %.6g"
         ", \"efficiency\": %.6g, \"checked\": %s, \"wrong\": %" PRIu64,
         STARPU_MAJOR_VERSION, STARPU_MINOR_VERSION, STARPU_RELEASE_VERSION, kind_names[G.kind], G.width, G.steps,
         workers, policy, tasks, edges, digest, grain_us, iterations, main_m.wall_s, main_m.wall_best_s,
         main_m.wall_s / (double)tasks * 1e9, main_m.efficiency, check ? "true" : "false",
         __atomic_load_n(&wrong, __ATOMIC_RELAXED));
  if (metg) {
    if (found >= 0)
      printf(", \"metg_us\": %.6g, \"metg\": {\"found\": ", probes[found].grain_us);
    else
      printf(", \"metg_us\": null, \"metg\": {\"found\": null");
    if (found >= 0) print_measured(&probes[found]);
    printf(", \"probes\": [");
    for (int i = 0; i < nprobes; i++) {
      if (i) printf(", ");
      print_measured(&probes[i]);
    }
    printf("], \"bisections\": 4}");
  }
  printf("}\n");

  if (G.kind != TRIVIAL)
    for (int parity = 0; parity < 2; parity++)
      for (uint64_t p = 0; p < G.width; p++) starpu_data_unregister(handles[parity][p]);
  starpu_shutdown();
  free(data);
  free(handles[0]);
  free(handles[1]);
  free(depbuf);
  return __atomic_load_n(&wrong, __ATOMIC_RELAXED) ? 1 : 0;
}
