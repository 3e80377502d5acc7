/*
 * minimal.c — a complete xpu plugin in plain C11, written against xpu_plugin.h alone.
 *
 * It offers two devices (plugin.minimal:0 and :1) whose memory is host memory. Each
 * stream owns a worker thread that runs the stream's queue in order, so enqueueing is
 * really asynchronous: an event completes when the worker reaches it, a wait on another
 * backend's event blocks the worker (a thread of the plugin's own, as the header asks),
 * and the failure of enqueued work is reported by the next synchronize or query and by
 * every event recorded after it. Work enqueued after a failure is skipped until the
 * failure has been reported.
 *
 * Builtin operations support every dtype with xpu's arithmetic: integers wrap; f16 and
 * bf16 are computed in f32 and rounded once to nearest even (the conversions are
 * written out below); min/max ignore a NaN operand; casts follow Rust's `as`.
 *
 * Kernels come in a tiny native format, "xpu-minimal-v1": the code is the four bytes
 * "XMK1" followed by an optional message, and the entry point picks one of a few fixed
 * kernels (see the kernel section).
 *
 * Build (POSIX threads):
 *   cc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -pthread \
 *      -I backends/plugin/include minimal.c -o libxpu_minimal.so
 *
 * Standard operations (ABI 1.1): relu, relu_backward and bias_add on f32, with any
 * strides (see the standard operations section). Fault injection (ABI 1.2, optional,
 * for testing only) is left out: device_inject_fault is NULL, and a host reports that
 * this plugin has no fault injection. Native collectives (ABI 1.3, optional) are left
 * out too: the group functions are NULL, and a host runs its own collective algorithms
 * over this plugin's copies and builtins.
 *
 * -DXPU_TEST_MINOR=N (N > 1) makes the plugin claim ABI 1.N and append two members to
 * its function table, as a plugin built against a newer header would; the host must
 * load it and ignore what it does not know. -DXPU_TEST_ABI_1_0 makes it present the
 * ABI 1.0 table (and version), as a plugin built before 1.1 would.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xpu_plugin.h"

#define MINIMAL_DEVICES 2u
#define MINIMAL_MEMORY (256ull << 20) /* per device; an accounting limit */
#define MESSAGE_MAX 512
#define KERNEL_FORMAT "xpu-minimal-v1"
#define KERNEL_MAGIC "XMK1"

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* ------------------------------------------------------------------- errors --- */

struct xpu_error {
  uint32_t code;
  int is_static;
  char message[MESSAGE_MAX];
};

/* Returned when there is no memory for an error object; never freed. */
static xpu_error no_memory_error = {XPU_ERROR_OUT_OF_MEMORY, 1,
                                    "the minimal plugin ran out of host memory"};

static PRINTF_LIKE(2, 3) xpu_error* error_new(uint32_t code, const char* fmt, ...) {
  xpu_error* e = malloc(sizeof *e);
  if (e == NULL) return &no_memory_error;
  e->code = code;
  e->is_static = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return e;
}

static uint32_t minimal_error_code(const xpu_error* e) {
  return e != NULL ? e->code : XPU_ERROR_INTERNAL;
}

static const char* minimal_error_message(const xpu_error* e) {
  return e != NULL ? e->message : "(no error)";
}

static void minimal_error_destroy(xpu_error* e) {
  if (e != NULL && !e->is_static) free(e);
}

/* A failure of enqueued work, kept by a stream or an event until it is reported. */
typedef struct failure {
  int set;
  uint32_t code;
  char message[MESSAGE_MAX];
} failure;

static PRINTF_LIKE(3, 4) void failure_set(failure* f, uint32_t code, const char* fmt, ...) {
  f->set = 1;
  f->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->message, sizeof f->message, fmt, ap);
  va_end(ap);
}

static xpu_error* failure_error(const failure* f) {
  return error_new(f->code, "%s", f->message);
}

/* Every function checks its argument struct against the ABI 1.0 size first. */
#define REQUIRE_ARGS(args, min)                                                          \
  do {                                                                                   \
    if ((args) == NULL || (args)->struct_size < (size_t)(min))                           \
      return error_new(XPU_ERROR_INVALID_ARGUMENT,                                       \
                       "%s: the argument struct is NULL or smaller than its ABI 1.0 " \
                       "size of %zu bytes",                                              \
                       __func__, (size_t)(min));                                         \
  } while (0)

#define REQUIRE(cond, ...)                                                 \
  do {                                                                     \
    if (!(cond)) return error_new(XPU_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

/* ------------------------------------------------------------- time, locks --- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void cond_init(pthread_cond_t* c) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
#if defined(__linux__)
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#endif
  pthread_cond_init(c, &attr);
  pthread_condattr_destroy(&attr);
}

/* Waits on `c` until `deadline` (now_ns() time); returns ETIMEDOUT when it passed. */
static int cond_wait_until(pthread_cond_t* c, pthread_mutex_t* m, uint64_t deadline) {
  struct timespec ts;
#if defined(__linux__)
  ts.tv_sec = (time_t)(deadline / 1000000000ull);
  ts.tv_nsec = (long)(deadline % 1000000000ull);
#else
  uint64_t now = now_ns();
  uint64_t left = deadline > now ? deadline - now : 0;
  struct timespec real;
  clock_gettime(CLOCK_REALTIME, &real);
  uint64_t at = (uint64_t)real.tv_sec * 1000000000ull + (uint64_t)real.tv_nsec + left;
  ts.tv_sec = (time_t)(at / 1000000000ull);
  ts.tv_nsec = (long)(at % 1000000000ull);
#endif
  return pthread_cond_timedwait(c, m, &ts);
}

/* ---------------------------------------------------------------- devices --- */

struct xpu_device {
  uint32_t index;
  uint64_t capacity;
  pthread_mutex_t lock; /* guards `used` */
  uint64_t used;
  char name[64];
};

struct xpu_buffer {
  xpu_device* device;
  uint64_t size;
  unsigned char* data;
};

static const char* const device_capabilities[] = {
    "execution=worker-thread-per-stream",
    "memory=host",
};

static xpu_error* minimal_device_count(xpu_device_count_args* args) {
  REQUIRE_ARGS(args, XPU_DEVICE_COUNT_ARGS_MIN_SIZE);
  args->count = MINIMAL_DEVICES;
  return NULL;
}

static xpu_error* minimal_device_open(xpu_device_open_args* args) {
  REQUIRE_ARGS(args, XPU_DEVICE_OPEN_ARGS_MIN_SIZE);
  REQUIRE(args->index < MINIMAL_DEVICES, "device_open: there is no device %u; there are %u",
          args->index, MINIMAL_DEVICES);
  xpu_device* d = calloc(1, sizeof *d);
  if (d == NULL) return &no_memory_error;
  d->index = args->index;
  d->capacity = MINIMAL_MEMORY;
  pthread_mutex_init(&d->lock, NULL);
  snprintf(d->name, sizeof d->name, "xpu minimal C device %u", args->index);
  args->device = d;
  return NULL;
}

static xpu_error* minimal_device_close(xpu_device_close_args* args) {
  REQUIRE_ARGS(args, XPU_DEVICE_CLOSE_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "device_close: the device is NULL");
  pthread_mutex_destroy(&args->device->lock);
  free(args->device);
  return NULL;
}

static xpu_error* minimal_device_properties(xpu_device_properties_args* args) {
  REQUIRE_ARGS(args, XPU_DEVICE_PROPERTIES_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "device_properties: the device is NULL");
  args->name = args->device->name;
  args->vendor = "xpu example";
  args->driver = "minimal.c 1.0";
  args->kind = XPU_DEVICE_KIND_OTHER;
  args->dtype_mask = (1u << XPU_DTYPE_F32) | (1u << XPU_DTYPE_F64) | (1u << XPU_DTYPE_F16) |
                     (1u << XPU_DTYPE_BF16) | (1u << XPU_DTYPE_I32) | (1u << XPU_DTYPE_I64) |
                     (1u << XPU_DTYPE_U8);
  args->memory_bytes = args->device->capacity;
  args->max_allocation = args->device->capacity;
  args->kernel_arg_alignment = 4;
  args->timeline_events = 0; /* a wait occupies the stream's worker thread */
  args->event_timing = 1;
  args->kernel_format = KERNEL_FORMAT;
  return NULL;
}

static xpu_error* minimal_memory_info(xpu_memory_info_args* args) {
  REQUIRE_ARGS(args, XPU_MEMORY_INFO_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "memory_info: the device is NULL");
  pthread_mutex_lock(&args->device->lock);
  args->total = args->device->capacity;
  args->free = args->device->capacity - args->device->used;
  pthread_mutex_unlock(&args->device->lock);
  return NULL;
}

static xpu_error* minimal_buffer_allocate(xpu_buffer_allocate_args* args) {
  REQUIRE_ARGS(args, XPU_BUFFER_ALLOCATE_ARGS_MIN_SIZE);
  xpu_device* d = args->device;
  REQUIRE(d != NULL, "buffer_allocate: the device is NULL");
  REQUIRE(args->size > 0, "buffer_allocate: the size is 0");
  pthread_mutex_lock(&d->lock);
  uint64_t free_bytes = d->capacity - d->used;
  if (args->size > free_bytes) {
    pthread_mutex_unlock(&d->lock);
    return error_new(XPU_ERROR_OUT_OF_MEMORY,
                     "%llu bytes requested, %llu of %llu bytes free on %s",
                     (unsigned long long)args->size, (unsigned long long)free_bytes,
                     (unsigned long long)d->capacity, d->name);
  }
  d->used += args->size;
  pthread_mutex_unlock(&d->lock);
  xpu_buffer* b = malloc(sizeof *b);
  unsigned char* data = (size_t)args->size == args->size ? calloc(1, (size_t)args->size) : NULL;
  if (b == NULL || data == NULL) {
    free(b);
    free(data);
    pthread_mutex_lock(&d->lock);
    d->used -= args->size;
    pthread_mutex_unlock(&d->lock);
    return error_new(XPU_ERROR_OUT_OF_MEMORY, "the host could not provide %llu bytes for %s",
                     (unsigned long long)args->size, d->name);
  }
  b->device = d;
  b->size = args->size;
  b->data = data;
  args->buffer = b;
  return NULL;
}

static xpu_error* minimal_buffer_free(xpu_buffer_free_args* args) {
  REQUIRE_ARGS(args, XPU_BUFFER_FREE_ARGS_MIN_SIZE);
  xpu_buffer* b = args->buffer;
  REQUIRE(b != NULL, "buffer_free: the buffer is NULL");
  pthread_mutex_lock(&b->device->lock);
  b->device->used -= b->size;
  pthread_mutex_unlock(&b->device->lock);
  free(b->data);
  free(b);
  return NULL;
}

/* Whether `r` is `length` bytes inside a buffer of device `d`. */
static int range_ok(const xpu_buffer_range* r, const xpu_device* d) {
  return r->buffer != NULL && r->buffer->device == d && r->length > 0 &&
         r->offset <= r->buffer->size && r->length <= r->buffer->size - r->offset;
}

static unsigned char* range_data(const xpu_buffer_range* r) {
  return r->buffer->data + r->offset;
}

/* ----------------------------------------------------------------- events --- */

struct xpu_event {
  pthread_mutex_t lock;
  pthread_cond_t done_cv;
  int refs; /* the host's handle, plus queued jobs that still use the event */
  int done;
  uint64_t time_ns;
  failure fail;
};

static xpu_event* event_new(int refs) {
  xpu_event* e = calloc(1, sizeof *e);
  if (e == NULL) return NULL;
  pthread_mutex_init(&e->lock, NULL);
  cond_init(&e->done_cv);
  e->refs = refs;
  return e;
}

static void event_retain(xpu_event* e) {
  pthread_mutex_lock(&e->lock);
  e->refs++;
  pthread_mutex_unlock(&e->lock);
}

static void event_release(xpu_event* e) {
  pthread_mutex_lock(&e->lock);
  int last = --e->refs == 0;
  pthread_mutex_unlock(&e->lock);
  if (last) {
    pthread_cond_destroy(&e->done_cv);
    pthread_mutex_destroy(&e->lock);
    free(e);
  }
}

static void event_complete(xpu_event* e, const failure* before) {
  pthread_mutex_lock(&e->lock);
  e->done = 1;
  e->time_ns = now_ns();
  if (before->set)
    failure_set(&e->fail, XPU_ERROR_ABORTED, "work enqueued before this event failed: %s",
                before->message);
  pthread_cond_broadcast(&e->done_cv);
  pthread_mutex_unlock(&e->lock);
}

/* ---------------------------------------------------------------- kernels --- */

typedef enum kernel_entry {
  KERNEL_MIX_I32,  /* (read src, read_write dst, i32 k): dst[i] = dst[i] * 3 + src[i] + k */
  KERNEL_DIMS_U32, /* (write out): out = grid[0..3], block[0..3] as u32, as far as it fits */
  KERNEL_SLEEP,    /* (i32 ms): sleeps */
  KERNEL_FAIL      /* (): fails with the code's message */
} kernel_entry;

struct xpu_kernel {
  xpu_device* device;
  kernel_entry entry;
  char message[MESSAGE_MAX];
};

static xpu_error* minimal_kernel_load(xpu_kernel_load_args* args) {
  REQUIRE_ARGS(args, XPU_KERNEL_LOAD_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "kernel_load: the device is NULL");
  if (args->format == NULL || strcmp(args->format, KERNEL_FORMAT) != 0)
    return error_new(XPU_ERROR_UNSUPPORTED, "kernel_load: the format is `%s`; this plugin loads `%s`",
                     args->format != NULL ? args->format : "(null)", KERNEL_FORMAT);
  REQUIRE(args->code != NULL && args->code_length >= 4 && memcmp(args->code, KERNEL_MAGIC, 4) == 0,
          "kernel_load: the code does not start with the %s magic `%s`", KERNEL_FORMAT,
          KERNEL_MAGIC);
  REQUIRE(args->entry_point != NULL, "kernel_load: the entry point is NULL");
  kernel_entry entry;
  if (strcmp(args->entry_point, "mix_i32") == 0) entry = KERNEL_MIX_I32;
  else if (strcmp(args->entry_point, "dims_u32") == 0) entry = KERNEL_DIMS_U32;
  else if (strcmp(args->entry_point, "sleep") == 0) entry = KERNEL_SLEEP;
  else if (strcmp(args->entry_point, "fail") == 0) entry = KERNEL_FAIL;
  else
    return error_new(XPU_ERROR_INVALID_ARGUMENT,
                     "kernel_load: there is no entry point `%s`; %s has mix_i32, dims_u32, "
                     "sleep and fail",
                     args->entry_point, KERNEL_FORMAT);
  xpu_kernel* k = calloc(1, sizeof *k);
  if (k == NULL) return &no_memory_error;
  k->device = args->device;
  k->entry = entry;
  size_t n = (size_t)(args->code_length - 4);
  if (n >= sizeof k->message) n = sizeof k->message - 1;
  memcpy(k->message, args->code + 4, n);
  k->message[n] = '\0';
  args->kernel = k;
  return NULL;
}

static xpu_error* minimal_kernel_destroy(xpu_kernel_destroy_args* args) {
  REQUIRE_ARGS(args, XPU_KERNEL_DESTROY_ARGS_MIN_SIZE);
  free(args->kernel);
  return NULL;
}

/* ------------------------------------------------------------ f16 / bf16 --- */

static uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

static float f32_from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13)); /* inf, NaN */
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign); /* zero */
    int e = -1;                               /* subnormal: normalise */
    do {
      e++;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    return f32_from_bits(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* f32 -> f16, rounding to nearest, ties to even. */
static uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = x & 0x80000000u, exp = x & 0x7F800000u, man = x & 0x007FFFFFu;
  if (exp == 0x7F800000u) { /* inf or NaN (kept quiet) */
    uint32_t nan_bit = man == 0 ? 0 : 0x0200u;
    return (uint16_t)((sign >> 16) | 0x7C00u | nan_bit | (man >> 13));
  }
  uint32_t half_sign = sign >> 16;
  int32_t half_exp = (int32_t)(exp >> 23) - 127 + 15;
  if (half_exp >= 0x1F) return (uint16_t)(half_sign | 0x7C00u); /* overflow: inf */
  if (half_exp <= 0) {                                           /* subnormal or zero */
    if (14 - half_exp > 24) return (uint16_t)half_sign;
    man |= 0x00800000u;
    uint32_t half_man = man >> (14 - half_exp);
    uint32_t round_bit = 1u << (13 - half_exp);
    if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) half_man++;
    return (uint16_t)(half_sign | half_man);
  }
  uint32_t out = half_sign | ((uint32_t)half_exp << 10) | (man >> 13);
  uint32_t round_bit = 0x1000u;
  if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) out++; /* may carry into inf */
  return (uint16_t)out;
}

static float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* f32 -> bf16, rounding to nearest, ties to even. */
static uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u); /* NaN */
  uint32_t round_bit = 0x8000u;
  if ((x & round_bit) != 0 && (x & (3u * round_bit - 1u)) != 0) return (uint16_t)((x >> 16) + 1);
  return (uint16_t)(x >> 16);
}

static double abs_d(double v) { return v < 0 ? -v : v; }

/* `v` rounded to f32 toward zero with the last bit set when inexact ("round to odd").
 * Rounding that once more to f16 or bf16 gives the correctly rounded result, where a
 * nearest-even f32 in between could round twice. */
static float f32_round_to_odd(double v) {
  float nearest = (float)v;
  if (!isfinite(nearest) || (double)nearest == v) return nearest;
  uint32_t bits = f32_bits(nearest);
  if (abs_d((double)nearest) > abs_d(v)) bits -= 1; /* rounded away from zero: step back */
  return f32_from_bits(bits | 1u);
}

/* The integer `v` rounded once, to nearest even, to `precision` significant bits, as an
 * exact f32 (for f16: 11 bits, bf16: 8). */
static float int_round(int64_t v, int precision) {
  uint64_t mag = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
  float r;
  if ((mag >> precision) == 0) {
    r = (float)mag; /* fewer than `precision` bits: exact */
  } else {
    int top = 63;
    while ((mag >> top) == 0) top--;
    int shift = top - (precision - 1);
    uint64_t kept = mag >> shift;
    uint64_t rest = mag & ((1ull << shift) - 1);
    uint64_t half = 1ull << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) kept++;
    r = (float)kept * f32_from_bits((uint32_t)(127 + shift) << 23); /* exact */
  }
  return v < 0 ? -r : r;
}

/* ----------------------------------------------------------- elementwise --- */

static size_t dtype_size(uint32_t dtype) {
  switch (dtype) {
    case XPU_DTYPE_F64:
    case XPU_DTYPE_I64: return 8;
    case XPU_DTYPE_F32:
    case XPU_DTYPE_I32: return 4;
    case XPU_DTYPE_F16:
    case XPU_DTYPE_BF16: return 2;
    case XPU_DTYPE_U8: return 1;
    default: return 0;
  }
}

/* Loads and stores through memcpy: any alignment, no aliasing questions. */
static uint16_t ld16(const unsigned char* p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t ld32(const unsigned char* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t ld64(const unsigned char* p) { uint64_t v; memcpy(&v, p, 8); return v; }
static float ldf(const unsigned char* p) { float v; memcpy(&v, p, 4); return v; }
static double ldd(const unsigned char* p) { double v; memcpy(&v, p, 8); return v; }
static void st16(unsigned char* p, uint16_t v) { memcpy(p, &v, 2); }
static void st32(unsigned char* p, uint32_t v) { memcpy(p, &v, 4); }
static void st64(unsigned char* p, uint64_t v) { memcpy(p, &v, 8); }
static void stf(unsigned char* p, float v) { memcpy(p, &v, 4); }
static void std_(unsigned char* p, double v) { memcpy(p, &v, 8); }

static float op_f32(uint32_t op, float a, float b) {
  switch (op) {
    case XPU_BINARY_SUM: return a + b;
    case XPU_BINARY_PROD: return a * b;
    case XPU_BINARY_MIN: return isnan(a) ? b : (isnan(b) || a <= b) ? a : b;
    default: return isnan(a) ? b : (isnan(b) || a >= b) ? a : b;
  }
}

static double op_f64(uint32_t op, double a, double b) {
  switch (op) {
    case XPU_BINARY_SUM: return a + b;
    case XPU_BINARY_PROD: return a * b;
    case XPU_BINARY_MIN: return isnan(a) ? b : (isnan(b) || a <= b) ? a : b;
    default: return isnan(a) ? b : (isnan(b) || a >= b) ? a : b;
  }
}

/* Integers: sums and products on the unsigned bits wrap; min/max compare signed. */
static uint32_t op_i32(uint32_t op, uint32_t a, uint32_t b) {
  int32_t sa, sb;
  memcpy(&sa, &a, 4);
  memcpy(&sb, &b, 4);
  switch (op) {
    case XPU_BINARY_SUM: return a + b;
    case XPU_BINARY_PROD: return a * b;
    case XPU_BINARY_MIN: return sa <= sb ? a : b;
    default: return sa >= sb ? a : b;
  }
}

static uint64_t op_i64(uint32_t op, uint64_t a, uint64_t b) {
  int64_t sa, sb;
  memcpy(&sa, &a, 8);
  memcpy(&sb, &b, 8);
  switch (op) {
    case XPU_BINARY_SUM: return a + b;
    case XPU_BINARY_PROD: return a * b;
    case XPU_BINARY_MIN: return sa <= sb ? a : b;
    default: return sa >= sb ? a : b;
  }
}

static uint8_t op_u8(uint32_t op, uint8_t a, uint8_t b) {
  switch (op) {
    case XPU_BINARY_SUM: return (uint8_t)(a + b);
    case XPU_BINARY_PROD: return (uint8_t)(a * b);
    case XPU_BINARY_MIN: return a <= b ? a : b;
    default: return a >= b ? a : b;
  }
}

/* dst[i] = a[i] op b[i * b_step] for n elements (b_step 0: one scalar). dst may be a or b. */
static void elementwise(uint32_t dtype, uint32_t op, unsigned char* dst, const unsigned char* a,
                        const unsigned char* b, size_t b_step, uint64_t n) {
  size_t s = dtype_size(dtype);
  for (uint64_t i = 0; i < n; i++) {
    unsigned char* d = dst + i * s;
    const unsigned char* x = a + i * s;
    const unsigned char* y = b + i * b_step;
    switch (dtype) {
      case XPU_DTYPE_F32: stf(d, op_f32(op, ldf(x), ldf(y))); break;
      case XPU_DTYPE_F64: std_(d, op_f64(op, ldd(x), ldd(y))); break;
      case XPU_DTYPE_F16:
        st16(d, f32_to_f16(op_f32(op, f16_to_f32(ld16(x)), f16_to_f32(ld16(y)))));
        break;
      case XPU_DTYPE_BF16:
        st16(d, f32_to_bf16(op_f32(op, bf16_to_f32(ld16(x)), bf16_to_f32(ld16(y)))));
        break;
      case XPU_DTYPE_I32: st32(d, op_i32(op, ld32(x), ld32(y))); break;
      case XPU_DTYPE_I64: st64(d, op_i64(op, ld64(x), ld64(y))); break;
      default: d[0] = op_u8(op, x[0], y[0]); break;
    }
  }
}

/* A value widened without loss: integers as int64, floats as double. */
typedef struct wide {
  int is_int;
  int64_t i;
  double f;
} wide;

static wide widen(uint32_t dtype, const unsigned char* p) {
  wide w = {0, 0, 0.0};
  switch (dtype) {
    case XPU_DTYPE_F32: w.f = ldf(p); break;
    case XPU_DTYPE_F64: w.f = ldd(p); break;
    case XPU_DTYPE_F16: w.f = f16_to_f32(ld16(p)); break;
    case XPU_DTYPE_BF16: w.f = bf16_to_f32(ld16(p)); break;
    case XPU_DTYPE_I32: {
      int32_t v;
      memcpy(&v, p, 4);
      w.is_int = 1;
      w.i = v;
      break;
    }
    case XPU_DTYPE_I64: {
      int64_t v;
      memcpy(&v, p, 8);
      w.is_int = 1;
      w.i = v;
      break;
    }
    default:
      w.is_int = 1;
      w.i = p[0];
      break;
  }
  return w;
}

/* Float -> integer as Rust's `as`: truncate toward zero, saturate, NaN -> 0. */
static int32_t sat_i32(double v) {
  if (isnan(v)) return 0;
  if (v >= 2147483648.0) return INT32_MAX;
  if (v <= -2147483649.0) return INT32_MIN;
  return (int32_t)v;
}

static int64_t sat_i64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

static uint8_t sat_u8(double v) {
  if (!(v > -1.0)) return 0; /* NaN too */
  if (v >= 256.0) return 255;
  return (uint8_t)v;
}

/* Stores `w` as `dtype` with Rust `as` semantics: integers wrap into narrower ones,
 * floats round once to nearest even. */
static void narrow(uint32_t dtype, unsigned char* p, wide w) {
  uint64_t bits = (uint64_t)w.i; /* two's complement bits, for wrapping */
  switch (dtype) {
    case XPU_DTYPE_F32: stf(p, w.is_int ? (float)w.i : (float)w.f); break;
    case XPU_DTYPE_F64: std_(p, w.is_int ? (double)w.i : w.f); break;
    case XPU_DTYPE_F16:
      st16(p, f32_to_f16(w.is_int ? int_round(w.i, 11) : f32_round_to_odd(w.f)));
      break;
    case XPU_DTYPE_BF16:
      st16(p, f32_to_bf16(w.is_int ? int_round(w.i, 8) : f32_round_to_odd(w.f)));
      break;
    case XPU_DTYPE_I32:
      if (w.is_int) {
        st32(p, (uint32_t)bits);
      } else {
        int32_t v = sat_i32(w.f);
        memcpy(p, &v, 4);
      }
      break;
    case XPU_DTYPE_I64:
      if (w.is_int) {
        st64(p, bits);
      } else {
        int64_t v = sat_i64(w.f);
        memcpy(p, &v, 8);
      }
      break;
    default: p[0] = w.is_int ? (uint8_t)bits : sat_u8(w.f); break;
  }
}

/* A builtin operation, resolved to memory. */
typedef struct builtin_job {
  uint32_t kind, op, dtype, dst_dtype;
  unsigned char* dst;
  const unsigned char* a;
  const unsigned char* b;
  uint64_t count; /* elements */
  unsigned char scalar[8];
} builtin_job;

static void run_builtin(const builtin_job* j) {
  size_t s = dtype_size(j->dtype);
  switch (j->kind) {
    case XPU_BUILTIN_FILL:
      for (uint64_t i = 0; i < j->count; i++) memcpy(j->dst + i * s, j->scalar, s);
      break;
    case XPU_BUILTIN_BINARY: elementwise(j->dtype, j->op, j->dst, j->a, j->b, s, j->count); break;
    case XPU_BUILTIN_ACCUMULATE:
      elementwise(j->dtype, j->op, j->dst, j->dst, j->a, s, j->count);
      break;
    case XPU_BUILTIN_SCALE:
      elementwise(j->dtype, XPU_BINARY_PROD, j->dst, j->a, j->scalar, 0, j->count);
      break;
    default: { /* cast; element by element, so an identical same-size range works */
      size_t ds = dtype_size(j->dst_dtype);
      for (uint64_t i = 0; i < j->count; i++)
        narrow(j->dst_dtype, j->dst + i * ds, widen(j->dtype, j->a + i * s));
      break;
    }
  }
}

/* ---------------------------------------------------- standard operations --- */
/* ABI 1.1. This device provides relu, relu_backward and bias_add on f32, with any
 * strides. Their meaning is the HAL's (xpu_hal::ops::Op); the host has checked shapes,
 * dtypes and overlaps, and sends only what device_ops lists. */

static const xpu_op_support device_op_list[] = {
    {XPU_OP_BIAS_ADD, 1u << XPU_DTYPE_F32},
    {XPU_OP_RELU, 1u << XPU_DTYPE_F32},
    {XPU_OP_RELU_BACKWARD, 1u << XPU_DTYPE_F32},
};

/* A tensor resolved to memory: element [i0, i1, ...] is at data + 4 * sum(ik * strides[k]). */
typedef struct op_tensor {
  unsigned char* data;
  uint32_t rank;
  uint64_t dims[XPU_MAX_RANK];
  uint64_t strides[XPU_MAX_RANK];
} op_tensor;

typedef struct op_job {
  uint32_t op;
  op_tensor t[3];
} op_job;

/* The address of element n (in row-major order) of an f32 tensor. */
static unsigned char* op_element(const op_tensor* t, uint64_t n) {
  uint64_t offset = 0;
  for (uint32_t k = t->rank; k-- > 0;) {
    offset += (n % t->dims[k]) * t->strides[k];
    n /= t->dims[k];
  }
  return t->data + offset * 4;
}

static uint64_t op_elements(const op_tensor* t) {
  uint64_t n = 1;
  for (uint32_t k = 0; k < t->rank; k++) n *= t->dims[k];
  return n;
}

/* Element by element, in row-major order: an output identical to an input (in place)
 * reads each element before writing it. */
static void run_op(const op_job* j) {
  uint64_t count = op_elements(&j->t[0]);
  switch (j->op) {
    case XPU_OP_RELU: /* x, y */
      for (uint64_t n = 0; n < count; n++) {
        float x = ldf(op_element(&j->t[0], n));
        stf(op_element(&j->t[1], n), (x > 0.0f || x != x) ? x : 0.0f);
      }
      break;
    case XPU_OP_RELU_BACKWARD: /* x, dy, dx */
      for (uint64_t n = 0; n < count; n++) {
        float x = ldf(op_element(&j->t[0], n));
        float dy = ldf(op_element(&j->t[1], n));
        stf(op_element(&j->t[2], n), x > 0.0f ? dy : 0.0f);
      }
      break;
    case XPU_OP_BIAS_ADD: { /* x [rows, cols], bias [cols], y [rows, cols] */
      uint64_t cols = j->t[0].dims[1];
      for (uint64_t n = 0; n < count; n++) {
        double x = ldf(op_element(&j->t[0], n));
        double b = ldf(j->t[1].data + (n % cols) * j->t[1].strides[0] * 4);
        stf(op_element(&j->t[2], n), (float)(x + b));
      }
      break;
    }
    default: break;
  }
}

static xpu_error* minimal_device_ops(xpu_device_ops_args* args) {
  REQUIRE_ARGS(args, XPU_DEVICE_OPS_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "device_ops: the device is NULL");
  args->ops = device_op_list;
  args->count = sizeof device_op_list / sizeof device_op_list[0];
  return NULL;
}

/* Checks tensor i and resolves it: f32, rank 1..4, and a range of this device that
 * spans exactly the bytes the layout addresses. */
static xpu_error* op_tensor_from(const xpu_tensor* t, uint32_t i, const xpu_device* d,
                                 op_tensor* out) {
  REQUIRE(t != NULL && t->struct_size >= XPU_TENSOR_MIN_SIZE,
          "op_enqueue: tensor %u is NULL or smaller than XPU_TENSOR_MIN_SIZE", i);
  if (t->dtype != XPU_DTYPE_F32)
    return error_new(XPU_ERROR_UNSUPPORTED, "op_enqueue: tensor %u has dtype %u; only f32 is provided",
                     i, t->dtype);
  REQUIRE(t->rank >= 1 && t->rank <= XPU_MAX_RANK, "op_enqueue: tensor %u has rank %u", i, t->rank);
  uint64_t span = 1;
  for (uint32_t k = 0; k < t->rank; k++) {
    REQUIRE(t->dims[k] > 0, "op_enqueue: tensor %u has an empty dimension", i);
    span += (t->dims[k] - 1) * t->strides[k];
  }
  REQUIRE(range_ok(&t->range, d) && t->range.length == span * 4 && t->range.offset % 4 == 0,
          "op_enqueue: tensor %u's range is not the %llu bytes its layout spans in a buffer of "
          "this device",
          i, (unsigned long long)(span * 4));
  out->data = range_data(&t->range);
  out->rank = t->rank;
  memcpy(out->dims, t->dims, sizeof out->dims);
  memcpy(out->strides, t->strides, sizeof out->strides);
  return NULL;
}

/* ---------------------------------------------------------------- streams --- */

typedef enum job_kind {
  JOB_COPY,
  JOB_BUILTIN,
  JOB_LAUNCH,
  JOB_OP,
  JOB_EVENT,
  JOB_WAIT_EVENT,
  JOB_WAIT_EXTERNAL
} job_kind;

typedef struct launch_job {
  const xpu_kernel* kernel;
  uint32_t grid[3], block[3];
  xpu_kernel_arg* args;
  uint64_t count;
} launch_job;

typedef struct job {
  struct job* next;
  job_kind kind;
  union {
    struct {
      unsigned char* dst;
      const unsigned char* src;
      uint64_t length;
    } copy;
    builtin_job builtin;
    launch_job launch;
    op_job op;
    xpu_event* event;
    xpu_external_event external;
  } u;
} job;

struct xpu_stream {
  xpu_device* device;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t work; /* a job was queued, or shutdown */
  pthread_cond_t idle; /* a job finished */
  job* head;
  job* tail;
  uint64_t submitted, completed;
  int shutdown;
  failure fail; /* the first failure since the last report */
};

static void run_launch(const launch_job* l, failure* out) {
  const xpu_kernel_arg* a = l->args;
  switch (l->kernel->entry) {
    case KERNEL_MIX_I32: {
      uint64_t n = a[0].range.length < a[1].range.length ? a[0].range.length : a[1].range.length;
      n /= 4;
      const unsigned char* src = n ? range_data(&a[0].range) : NULL;
      unsigned char* dst = n ? range_data(&a[1].range) : NULL;
      uint32_t k;
      memcpy(&k, a[2].scalar, 4);
      for (uint64_t i = 0; i < n; i++)
        st32(dst + 4 * i, ld32(dst + 4 * i) * 3u + ld32(src + 4 * i) + k);
      break;
    }
    case KERNEL_DIMS_U32: {
      uint32_t dims[6] = {l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2]};
      uint64_t n = a[0].range.length / 4;
      if (n > 6) n = 6;
      for (uint64_t i = 0; i < n; i++) st32(range_data(&a[0].range) + 4 * i, dims[i]);
      break;
    }
    case KERNEL_SLEEP: {
      int32_t ms;
      memcpy(&ms, a[0].scalar, 4);
      if (ms > 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
      }
      break;
    }
    default:
      failure_set(out, XPU_ERROR_ABORTED, "kernel `fail` failed: %s",
                  l->kernel->message[0] ? l->kernel->message : "(no message)");
      break;
  }
}

/* Runs one job. `before` is the stream's pending failure; `out` gets a new one. */
static void run_job(job* j, const failure* before, failure* out) {
  switch (j->kind) {
    case JOB_EVENT:
      event_complete(j->u.event, before);
      event_release(j->u.event);
      return;
    case JOB_WAIT_EXTERNAL: {
      /* Called exactly once, then released, even when earlier work failed. */
      int32_t rc = j->u.external.wait(j->u.external.context);
      if (j->u.external.release != NULL) j->u.external.release(j->u.external.context);
      if (rc != 0)
        failure_set(out, XPU_ERROR_ABORTED,
                    "an event of another backend that this stream waited on failed (wait "
                    "returned %d)",
                    (int)rc);
      return;
    }
    case JOB_WAIT_EVENT: {
      xpu_event* e = j->u.event;
      pthread_mutex_lock(&e->lock);
      while (!e->done) pthread_cond_wait(&e->done_cv, &e->lock);
      failure f = e->fail;
      pthread_mutex_unlock(&e->lock);
      event_release(e);
      if (f.set) failure_set(out, XPU_ERROR_ABORTED, "an event this stream waited on failed: %s", f.message);
      return;
    }
    default: break;
  }
  if (before->set) return; /* skipped: earlier work failed and is not reported yet */
  switch (j->kind) {
    case JOB_COPY: memcpy(j->u.copy.dst, j->u.copy.src, (size_t)j->u.copy.length); break;
    case JOB_BUILTIN: run_builtin(&j->u.builtin); break;
    case JOB_LAUNCH: run_launch(&j->u.launch, out); break;
    case JOB_OP: run_op(&j->u.op); break;
    default: break;
  }
}

static void job_free(job* j) {
  if (j->kind == JOB_LAUNCH) free(j->u.launch.args);
  free(j);
}

static void* stream_worker(void* arg) {
  xpu_stream* s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->head == NULL && !s->shutdown) pthread_cond_wait(&s->work, &s->lock);
    job* j = s->head;
    if (j == NULL) break; /* shut down, and the queue is drained */
    s->head = j->next;
    if (s->head == NULL) s->tail = NULL;
    failure before = s->fail;
    pthread_mutex_unlock(&s->lock);
    failure result;
    result.set = 0;
    run_job(j, &before, &result);
    job_free(j);
    pthread_mutex_lock(&s->lock);
    if (result.set && !s->fail.set) s->fail = result;
    s->completed++;
    pthread_cond_broadcast(&s->idle);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static xpu_error* stream_push(xpu_stream* s, job* j) {
  j->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->tail != NULL) s->tail->next = j;
  else s->head = j;
  s->tail = j;
  s->submitted++;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static job* job_new(job_kind kind) {
  job* j = calloc(1, sizeof *j);
  if (j != NULL) j->kind = kind;
  return j;
}

static xpu_error* minimal_stream_create(xpu_stream_create_args* args) {
  REQUIRE_ARGS(args, XPU_STREAM_CREATE_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "stream_create: the device is NULL");
  xpu_stream* s = calloc(1, sizeof *s);
  if (s == NULL) return &no_memory_error;
  s->device = args->device;
  pthread_mutex_init(&s->lock, NULL);
  cond_init(&s->work);
  cond_init(&s->idle);
  int rc = pthread_create(&s->thread, NULL, stream_worker, s);
  if (rc != 0) {
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return error_new(XPU_ERROR_OUT_OF_MEMORY, "stream_create: no thread for the stream: %s",
                     strerror(rc));
  }
  args->stream = s;
  return NULL;
}

/* Finishes the queued work, then frees the stream. */
static xpu_error* minimal_stream_destroy(xpu_stream_args* args) {
  REQUIRE_ARGS(args, XPU_STREAM_ARGS_MIN_SIZE);
  xpu_stream* s = args->stream;
  REQUIRE(s != NULL, "stream_destroy: the stream is NULL");
  pthread_mutex_lock(&s->lock);
  s->shutdown = 1;
  pthread_cond_broadcast(&s->work);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->idle);
  pthread_cond_destroy(&s->work);
  pthread_mutex_destroy(&s->lock);
  free(s);
  return NULL;
}

static xpu_error* minimal_stream_synchronize(xpu_stream_args* args) {
  REQUIRE_ARGS(args, XPU_STREAM_ARGS_MIN_SIZE);
  xpu_stream* s = args->stream;
  REQUIRE(s != NULL, "stream_synchronize: the stream is NULL");
  pthread_mutex_lock(&s->lock);
  uint64_t target = s->submitted;
  while (s->completed < target) pthread_cond_wait(&s->idle, &s->lock);
  xpu_error* e = NULL;
  if (s->fail.set) {
    e = failure_error(&s->fail);
    s->fail.set = 0;
  }
  pthread_mutex_unlock(&s->lock);
  return e;
}

static xpu_error* minimal_stream_query(xpu_stream_query_args* args) {
  REQUIRE_ARGS(args, XPU_STREAM_QUERY_ARGS_MIN_SIZE);
  xpu_stream* s = args->stream;
  REQUIRE(s != NULL, "stream_query: the stream is NULL");
  pthread_mutex_lock(&s->lock);
  args->done = s->completed == s->submitted;
  xpu_error* e = NULL;
  if (s->fail.set) {
    e = failure_error(&s->fail);
    s->fail.set = 0;
  }
  pthread_mutex_unlock(&s->lock);
  return e;
}

static xpu_error* enqueue_copy(xpu_copy_args* args, unsigned char* dst, const unsigned char* src) {
  job* j = job_new(JOB_COPY);
  if (j == NULL) return &no_memory_error;
  j->u.copy.dst = dst;
  j->u.copy.src = src;
  j->u.copy.length = args->length;
  return stream_push(args->stream, j);
}

static xpu_error* minimal_copy_host_to_device(xpu_copy_args* args) {
  REQUIRE_ARGS(args, XPU_COPY_ARGS_MIN_SIZE);
  REQUIRE(args->stream != NULL && args->host != NULL, "copy_host_to_device: NULL stream or host");
  REQUIRE(range_ok(&args->dst, args->stream->device) && args->dst.length == args->length,
          "copy_host_to_device: the destination is not %llu bytes of a buffer of this device",
          (unsigned long long)args->length);
  return enqueue_copy(args, range_data(&args->dst), args->host);
}

static xpu_error* minimal_copy_device_to_host(xpu_copy_args* args) {
  REQUIRE_ARGS(args, XPU_COPY_ARGS_MIN_SIZE);
  REQUIRE(args->stream != NULL && args->host != NULL, "copy_device_to_host: NULL stream or host");
  REQUIRE(range_ok(&args->src, args->stream->device) && args->src.length == args->length,
          "copy_device_to_host: the source is not %llu bytes of a buffer of this device",
          (unsigned long long)args->length);
  return enqueue_copy(args, args->host, range_data(&args->src));
}

static xpu_error* minimal_copy_device_to_device(xpu_copy_args* args) {
  REQUIRE_ARGS(args, XPU_COPY_ARGS_MIN_SIZE);
  REQUIRE(args->stream != NULL, "copy_device_to_device: the stream is NULL");
  REQUIRE(range_ok(&args->src, args->stream->device) && range_ok(&args->dst, args->stream->device) &&
              args->src.length == args->length && args->dst.length == args->length,
          "copy_device_to_device: the ranges are not %llu bytes of buffers of this device",
          (unsigned long long)args->length);
  return enqueue_copy(args, range_data(&args->dst), range_data(&args->src));
}

static xpu_error* minimal_builtin(xpu_builtin_args* args) {
  REQUIRE_ARGS(args, XPU_BUILTIN_ARGS_MIN_SIZE);
  xpu_stream* s = args->stream;
  REQUIRE(s != NULL, "builtin: the stream is NULL");
  REQUIRE(args->kind <= XPU_BUILTIN_CAST, "builtin: unknown kind %u", args->kind);
  size_t size = dtype_size(args->dtype);
  REQUIRE(size != 0, "builtin: unknown dtype %u", args->dtype);
  size_t dst_size = args->kind == XPU_BUILTIN_CAST ? dtype_size(args->dst_dtype) : size;
  REQUIRE(dst_size != 0, "builtin: unknown destination dtype %u", args->dst_dtype);
  REQUIRE(args->kind == XPU_BUILTIN_FILL || args->kind == XPU_BUILTIN_SCALE ||
              args->kind == XPU_BUILTIN_CAST || args->op <= XPU_BINARY_MAX,
          "builtin: unknown operator %u", args->op);
  REQUIRE(range_ok(&args->dst, s->device) && args->dst.length % dst_size == 0,
          "builtin: the destination is not whole elements of a buffer of this device");
  uint64_t count = args->dst.length / dst_size;
  int uses_a = args->kind != XPU_BUILTIN_FILL;
  int uses_b = args->kind == XPU_BUILTIN_BINARY;
  REQUIRE(!uses_a || (range_ok(&args->a, s->device) && args->a.length == count * size),
          "builtin: operand a is not %llu elements of a buffer of this device",
          (unsigned long long)count);
  REQUIRE(!uses_b || (range_ok(&args->b, s->device) && args->b.length == count * size),
          "builtin: operand b is not %llu elements of a buffer of this device",
          (unsigned long long)count);
  job* j = job_new(JOB_BUILTIN);
  if (j == NULL) return &no_memory_error;
  builtin_job* b = &j->u.builtin;
  b->kind = args->kind;
  b->op = args->op;
  b->dtype = args->dtype;
  b->dst_dtype = args->dst_dtype;
  b->dst = range_data(&args->dst);
  b->a = uses_a ? range_data(&args->a) : NULL;
  b->b = uses_b ? range_data(&args->b) : NULL;
  b->count = count;
  memcpy(b->scalar, args->scalar, sizeof b->scalar);
  return stream_push(s, j);
}

static xpu_error* minimal_op_enqueue(xpu_op_args* args) {
  REQUIRE_ARGS(args, XPU_OP_ARGS_MIN_SIZE);
  xpu_stream* s = args->stream;
  REQUIRE(s != NULL, "op_enqueue: the stream is NULL");
  uint32_t count;
  switch (args->op) {
    case XPU_OP_RELU: count = 2; break;
    case XPU_OP_RELU_BACKWARD:
    case XPU_OP_BIAS_ADD: count = 3; break;
    default:
      return error_new(XPU_ERROR_UNSUPPORTED,
                       "op_enqueue: operation %u is not provided (relu, relu_backward and "
                       "bias_add are)",
                       args->op);
  }
  REQUIRE(args->tensor_count == count && args->tensors != NULL,
          "op_enqueue: operation %u takes %u tensors, not %u", args->op, count, args->tensor_count);
  job* j = job_new(JOB_OP);
  if (j == NULL) return &no_memory_error;
  j->u.op.op = args->op;
  for (uint32_t i = 0; i < count; i++) {
    xpu_error* e = op_tensor_from(args->tensors[i], i, s->device, &j->u.op.t[i]);
    if (e != NULL) {
      job_free(j);
      return e;
    }
  }
  return stream_push(s, j);
}

static xpu_error* minimal_kernel_launch(xpu_kernel_launch_args* args) {
  REQUIRE_ARGS(args, XPU_KERNEL_LAUNCH_ARGS_MIN_SIZE);
  xpu_stream* s = args->stream;
  const xpu_kernel* k = args->kernel;
  REQUIRE(s != NULL && k != NULL, "kernel_launch: NULL stream or kernel");
  REQUIRE(k->device == s->device, "kernel_launch: the kernel belongs to another device");
  static const uint64_t arity[] = {3, 1, 1, 0};
  REQUIRE(args->arg_count == arity[k->entry] && (args->arg_count == 0 || args->args != NULL),
          "kernel_launch: the kernel takes %llu arguments, the launch gave %llu",
          (unsigned long long)arity[k->entry], (unsigned long long)args->arg_count);
  for (uint64_t i = 0; i < args->arg_count; i++) {
    const xpu_kernel_arg* a = &args->args[i];
    int want_buffer = (k->entry == KERNEL_MIX_I32 && i < 2) || k->entry == KERNEL_DIMS_U32;
    if (want_buffer) {
      REQUIRE(a->kind == XPU_KERNEL_ARG_BUFFER, "kernel_launch: argument %llu must be a buffer",
              (unsigned long long)i);
      REQUIRE(a->range.length == 0 || range_ok(&a->range, s->device),
              "kernel_launch: argument %llu is not a range of a buffer of this device",
              (unsigned long long)i);
    } else {
      REQUIRE(a->kind == XPU_KERNEL_ARG_SCALAR && a->dtype == XPU_DTYPE_I32,
              "kernel_launch: argument %llu must be an i32 scalar", (unsigned long long)i);
    }
  }
  job* j = job_new(JOB_LAUNCH);
  if (j == NULL) return &no_memory_error;
  launch_job* l = &j->u.launch;
  l->kernel = k;
  memcpy(l->grid, args->grid, sizeof l->grid);
  memcpy(l->block, args->block, sizeof l->block);
  l->count = args->arg_count;
  if (l->count > 0) {
    l->args = malloc((size_t)l->count * sizeof *l->args);
    if (l->args == NULL) {
      free(j);
      return &no_memory_error;
    }
    memcpy(l->args, args->args, (size_t)l->count * sizeof *l->args);
  }
  return stream_push(s, j);
}

/* ---------------------------------------------------------- event functions --- */

static xpu_error* minimal_event_record(xpu_event_record_args* args) {
  REQUIRE_ARGS(args, XPU_EVENT_RECORD_ARGS_MIN_SIZE);
  REQUIRE(args->stream != NULL, "event_record: the stream is NULL");
  xpu_event* e = event_new(2); /* the host's handle and the queued job */
  job* j = job_new(JOB_EVENT);
  if (e == NULL || j == NULL) {
    free(e);
    free(j);
    return &no_memory_error;
  }
  j->u.event = e;
  args->event = e;
  return stream_push(args->stream, j);
}

static xpu_error* minimal_event_destroy(xpu_event_args* args) {
  REQUIRE_ARGS(args, XPU_EVENT_ARGS_MIN_SIZE);
  REQUIRE(args->event != NULL, "event_destroy: the event is NULL");
  event_release(args->event);
  return NULL;
}

static xpu_error* minimal_event_query(xpu_event_query_args* args) {
  REQUIRE_ARGS(args, XPU_EVENT_QUERY_ARGS_MIN_SIZE);
  xpu_event* e = args->event;
  REQUIRE(e != NULL, "event_query: the event is NULL");
  pthread_mutex_lock(&e->lock);
  args->done = (uint32_t)e->done;
  xpu_error* err = e->done && e->fail.set ? failure_error(&e->fail) : NULL;
  pthread_mutex_unlock(&e->lock);
  return err;
}

static xpu_error* minimal_event_wait(xpu_event_wait_args* args) {
  REQUIRE_ARGS(args, XPU_EVENT_WAIT_ARGS_MIN_SIZE);
  xpu_event* e = args->event;
  REQUIRE(e != NULL, "event_wait: the event is NULL");
  uint64_t start = now_ns();
  uint64_t deadline = args->timeout_ns == UINT64_MAX || args->timeout_ns > UINT64_MAX - start
                          ? UINT64_MAX
                          : start + args->timeout_ns;
  pthread_mutex_lock(&e->lock);
  while (!e->done) {
    if (deadline == UINT64_MAX) {
      pthread_cond_wait(&e->done_cv, &e->lock);
    } else if (cond_wait_until(&e->done_cv, &e->lock, deadline) == ETIMEDOUT && !e->done) {
      pthread_mutex_unlock(&e->lock);
      return error_new(XPU_ERROR_TIMEOUT, "the event did not complete within %llu ns",
                       (unsigned long long)args->timeout_ns);
    }
  }
  xpu_error* err = e->fail.set ? failure_error(&e->fail) : NULL;
  pthread_mutex_unlock(&e->lock);
  return err;
}

static xpu_error* minimal_event_elapsed(xpu_event_elapsed_args* args) {
  REQUIRE_ARGS(args, XPU_EVENT_ELAPSED_ARGS_MIN_SIZE);
  REQUIRE(args->start != NULL && args->end != NULL, "event_elapsed: NULL event");
  pthread_mutex_lock(&args->start->lock);
  int start_done = args->start->done;
  uint64_t t0 = args->start->time_ns;
  pthread_mutex_unlock(&args->start->lock);
  pthread_mutex_lock(&args->end->lock);
  int end_done = args->end->done;
  uint64_t t1 = args->end->time_ns;
  pthread_mutex_unlock(&args->end->lock);
  REQUIRE(start_done && end_done, "event_elapsed: both events must be complete");
  args->elapsed_ns = t1 > t0 ? t1 - t0 : 0;
  return NULL;
}

static xpu_error* minimal_stream_wait_event(xpu_stream_wait_event_args* args) {
  REQUIRE_ARGS(args, XPU_STREAM_WAIT_EVENT_ARGS_MIN_SIZE);
  REQUIRE(args->stream != NULL && args->event != NULL, "stream_wait_event: NULL stream or event");
  job* j = job_new(JOB_WAIT_EVENT);
  if (j == NULL) return &no_memory_error;
  event_retain(args->event);
  j->u.event = args->event;
  return stream_push(args->stream, j);
}

/* Ownership of the external event passes to the plugin only when the call succeeds: on
 * a refusal neither `wait` nor `release` is called and the event stays the host's (as
 * xpu-plugin-sdk does; the header does not say). */
static xpu_error* minimal_stream_wait_external(xpu_stream_wait_external_args* args) {
  REQUIRE_ARGS(args, XPU_STREAM_WAIT_EXTERNAL_ARGS_MIN_SIZE);
  REQUIRE(args->stream != NULL && args->external.wait != NULL,
          "stream_wait_external: NULL stream or wait function");
  job* j = job_new(JOB_WAIT_EXTERNAL);
  if (j == NULL) return &no_memory_error;
  j->u.external = args->external;
  return stream_push(args->stream, j);
}

/* ------------------------------------------------------------- extensions --- */

static xpu_error* minimal_capabilities(xpu_capabilities_args* args) {
  REQUIRE_ARGS(args, XPU_CAPABILITIES_ARGS_MIN_SIZE);
  REQUIRE(args->device != NULL, "capabilities: the device is NULL");
  args->capabilities = device_capabilities;
  args->count = sizeof device_capabilities / sizeof device_capabilities[0];
  return NULL;
}

static const xpu_capabilities_extension capabilities_extension = {
    {XPU_STRUCT_SIZE(xpu_capabilities_extension, capabilities), XPU_EXTENSION_CAPABILITIES, NULL},
    minimal_capabilities,
};

/* ------------------------------------------------------------------ table --- */

#if defined(XPU_TEST_MINOR) && XPU_TEST_MINOR > 0
/* What a plugin built against a newer 1.N header looks like: members appended. */
static xpu_error* minimal_future_function(void* args) {
  (void)args;
  return error_new(XPU_ERROR_INTERNAL, "a function of ABI 1.%d was called", XPU_TEST_MINOR);
}
typedef struct minimal_api {
  xpu_plugin_api base;
  xpu_error* (*future_function)(void* args);
  uint64_t future_field;
} minimal_api;
#define MINIMAL_API_SIZE XPU_STRUCT_SIZE(minimal_api, future_field)
#define MINIMAL_API_MINOR XPU_TEST_MINOR
#define MINIMAL_API_TAIL , minimal_future_function, 0x1234
#else
typedef struct minimal_api {
  xpu_plugin_api base;
} minimal_api;
#define MINIMAL_API_SIZE XPU_STRUCT_SIZE(xpu_plugin_api, device_inject_fault)
#define MINIMAL_API_MINOR XPU_PLUGIN_ABI_MINOR
#define MINIMAL_API_TAIL
#endif

#if defined(XPU_TEST_ABI_1_0)
/* What a plugin built against the 1.0 header looks like to a host: the 1.0 table and
 * version. The functions of 1.1 are still in memory beyond struct_size, where a host
 * must not look. */
#undef MINIMAL_API_SIZE
#undef MINIMAL_API_MINOR
#define MINIMAL_API_SIZE XPU_PLUGIN_API_MIN_SIZE
#define MINIMAL_API_MINOR 0
#endif

static const minimal_api api = {
    {
        MINIMAL_API_SIZE,
        &capabilities_extension.base,
        XPU_PLUGIN_ABI_MAJOR,
        MINIMAL_API_MINOR,
        "minimal",
        "1.0.0",
        minimal_error_code,
        minimal_error_message,
        minimal_error_destroy,
        minimal_device_count,
        minimal_device_open,
        minimal_device_close,
        minimal_device_properties,
        minimal_memory_info,
        minimal_buffer_allocate,
        minimal_buffer_free,
        minimal_stream_create,
        minimal_stream_destroy,
        minimal_stream_synchronize,
        minimal_stream_query,
        minimal_copy_host_to_device,
        minimal_copy_device_to_host,
        minimal_copy_device_to_device,
        minimal_builtin,
        minimal_event_record,
        minimal_event_destroy,
        minimal_event_query,
        minimal_event_wait,
        minimal_stream_wait_event,
        minimal_stream_wait_external,
        minimal_event_elapsed,
        minimal_kernel_load,
        minimal_kernel_destroy,
        minimal_kernel_launch,
        minimal_device_ops,
        minimal_op_enqueue,
        NULL, /* device_inject_fault (ABI 1.2): no fault injection */
        NULL, /* group_create (ABI 1.3): no collective library of its own */
        NULL, /* group_run */
        NULL, /* group_abort */
        NULL, /* group_destroy */
        NULL, /* group_id (ABI 1.4): no groups across processes */
    } MINIMAL_API_TAIL};

XPU_PLUGIN_EXPORT const xpu_plugin_api* xpu_plugin_get_api(const xpu_host_info* host) {
  /* The table is returned whatever the host's version, so that a host of another major
   * version can name both versions in its error. */
  if (host == NULL || host->struct_size < XPU_HOST_INFO_MIN_SIZE) return NULL;
  return &api.base;
}
