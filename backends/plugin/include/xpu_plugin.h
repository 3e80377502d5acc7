/*
 * xpu_plugin.h — the xpu vendor plugin ABI.
 *
 * A vendor makes its accelerator an xpu device by building a shared library against
 * this header alone (it includes only standard C headers) and exporting one symbol,
 * XPU_PLUGIN_ENTRY_SYMBOL. xpu loads the library at run time, calls that symbol with
 * the highest ABI version it understands, and drives the device through the returned
 * function table. A plugin device is then indistinguishable from a built-in one.
 *
 * ---------------------------------------------------------------------------------
 * VERSIONING
 *
 *   XPU_PLUGIN_ABI_MAJOR changes only when an existing function or field changes
 *   meaning or is removed. A host refuses a plugin of another major version, with an
 *   error naming both versions. The first four members of xpu_plugin_api
 *   (struct_size, extensions, abi_major, abi_minor) and of xpu_host_info keep their
 *   positions in every major version, so that both sides can always read each other's
 *   version.
 *
 *   XPU_PLUGIN_ABI_MINOR changes when something is appended: a function at the end of
 *   xpu_plugin_api, a field at the end of an argument struct, an enum value. Within one
 *   major version every combination of host and plugin minor versions works:
 *     - Every struct passed across the boundary starts with `size_t struct_size`, set
 *       by whoever allocated the struct to XPU_STRUCT_SIZE(type, last field it knows).
 *     - The reader of a struct reads only the fields that lie within struct_size; a
 *       field beyond it is treated as zero / NULL. The writer of an output field writes
 *       it only if it lies within struct_size. Nobody ever requires struct_size to
 *       *equal* their own size, only to reach the struct's MIN_SIZE macro, its size
 *       in the version that introduced it (1.0 for most; 1.1 for the structs of the
 *       standard operations; 1.2 for xpu_device_fault_args; 1.3 for those of the
 *       native collectives; 1.4 for xpu_group_id_args).
 *     - A function pointer in xpu_plugin_api that is NULL or beyond its struct_size is
 *       absent. Functions marked REQUIRED must be present.
 *   Optional features live in extensions: a chain of structs, each starting with
 *   xpu_extension_base, hung off the `extensions` field of the struct they extend.
 *   Unknown extension types are skipped.
 *
 * ERRORS
 *
 *   Every function that can fail returns `xpu_error*`: NULL on success, else an error
 *   object the plugin allocated. The host reads it with error_code/error_message and
 *   frees it with error_destroy, exactly once. Error codes are xpu_error_code values;
 *   the message should say what was asked, what was found and what to do.
 *   A plugin must never let a C++ exception or a Rust panic cross this boundary.
 *   An error's code and message stay the same until error_destroy.
 *
 *   Whatever the host has already checked, a plugin refuses, without crashing:
 *     - a NULL argument struct, or one whose struct_size is below its MIN_SIZE, with
 *       XPU_ERROR_INVALID_ARGUMENT;
 *     - a NULL handle (device, buffer, stream, event, kernel) where the function needs
 *       one, with XPU_ERROR_INVALID_ARGUMENT, also when its other handles are valid;
 *     - a device index at or past device_count's, with XPU_ERROR_INVALID_ARGUMENT;
 *     - a value of an enum it does not know (a builtin kind, a dtype), with
 *       XPU_ERROR_UNSUPPORTED or XPU_ERROR_INVALID_ARGUMENT, when the call is made
 *       (nothing is enqueued).
 *   device_count gives the same count on every call. Memory running out is
 *   XPU_ERROR_OUT_OF_MEMORY and no other code, also when each allocation alone would
 *   fit; freeing the buffers gives all their memory back to memory_info's `free`.
 *   (`xpu conformance --profile abi` calls the table directly to check these.)
 *
 * OWNERSHIP AND LIFETIMES
 *
 *   Handles (xpu_device, xpu_buffer, xpu_stream, xpu_event, xpu_kernel) are opaque
 *   pointers owned by the plugin, created by an "open", "create", "allocate", "load"
 *   or "record" function and released by the matching "close", "destroy" or "free"
 *   function, exactly once. The host destroys children before their device.
 *   stream_destroy returns only after the stream's enqueued work has finished; no
 *   plugin code runs for a stream after its destroy returns, and none runs at all once
 *   the last device is closed. An event stays usable after its stream is destroyed,
 *   and may be destroyed while a stream still waits on it (the wait is not affected).
 *   Strings returned by the plugin are valid for the lifetime stated at each field.
 *
 * THREAD SAFETY
 *
 *   Every function may be called from any thread, concurrently with any other
 *   function, on the same object too — except that a close, destroy or free function
 *   is never called concurrently with another call on the object it releases. Calls on
 *   one stream may come from several threads; the plugin serialises them (enqueue
 *   order = call completion order).
 *
 * ASYNCHRONY
 *
 *   Stream functions enqueue and return. Work on one stream runs in enqueue order.
 *   Host memory passed to a copy must stay valid until the copy has run; the host keeps
 *   it valid until stream_synchronize returns, or until an event recorded after the
 *   copy completes. Enqueue-time validation errors are returned at once; failures of the
 *   work itself are returned by the next stream_synchronize/stream_query and by events
 *   recorded after the failure.
 */
#ifndef XPU_PLUGIN_H
#define XPU_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XPU_PLUGIN_ABI_MAJOR 1
#define XPU_PLUGIN_ABI_MINOR 4

/* The symbol every plugin exports (type xpu_plugin_get_api_fn). */
#define XPU_PLUGIN_ENTRY_SYMBOL "xpu_plugin_get_api"

#if defined(_WIN32)
#define XPU_PLUGIN_EXPORT __declspec(dllexport)
#else
#define XPU_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Size of a struct up to and including `last`: what struct_size is set to. */
#define XPU_STRUCT_SIZE(type, last) (offsetof(type, last) + sizeof(((type*)0)->last))

/* ---------------------------------------------------------------- basic types --- */

typedef enum xpu_error_code {
  XPU_ERROR_INVALID_ARGUMENT = 1, /* the caller's arguments are wrong */
  XPU_ERROR_OUT_OF_MEMORY = 2,    /* an allocation did not fit; the device is usable */
  XPU_ERROR_UNSUPPORTED = 3,      /* the device cannot do this */
  XPU_ERROR_UNAVAILABLE = 4,      /* the hardware or its driver is not present */
  XPU_ERROR_DEVICE_LOST = 5,      /* the device stopped working */
  XPU_ERROR_TIMEOUT = 6,          /* a wait ran out of time */
  XPU_ERROR_ABORTED = 7,          /* work did not run because something failed first */
  XPU_ERROR_INTERNAL = 8          /* anything else */
} xpu_error_code;

typedef enum xpu_dtype {
  XPU_DTYPE_F32 = 0,
  XPU_DTYPE_F64 = 1,
  XPU_DTYPE_F16 = 2,
  XPU_DTYPE_BF16 = 3,
  XPU_DTYPE_I32 = 4,
  XPU_DTYPE_I64 = 5,
  XPU_DTYPE_U8 = 6
} xpu_dtype;

typedef enum xpu_device_kind {
  XPU_DEVICE_KIND_CPU = 0,
  XPU_DEVICE_KIND_GPU = 1,
  XPU_DEVICE_KIND_NPU = 2,
  XPU_DEVICE_KIND_OTHER = 3
} xpu_device_kind;

typedef enum xpu_builtin_kind {
  XPU_BUILTIN_FILL = 0,       /* dst[i] = scalar                      (dtype)     */
  XPU_BUILTIN_BINARY = 1,     /* dst[i] = a[i] op b[i]                (dtype, op) */
  XPU_BUILTIN_ACCUMULATE = 2, /* dst[i] = dst[i] op a[i]              (dtype, op) */
  XPU_BUILTIN_SCALE = 3,      /* dst[i] = a[i] * scalar               (dtype)     */
  XPU_BUILTIN_CAST = 4        /* dst[i] = (dst_dtype) a[i]      (dtype = source)  */
} xpu_builtin_kind;

typedef enum xpu_binary_op {
  XPU_BINARY_SUM = 0,
  XPU_BINARY_PROD = 1,
  XPU_BINARY_MIN = 2,
  XPU_BINARY_MAX = 3
} xpu_binary_op;

typedef enum xpu_kernel_arg_kind {
  XPU_KERNEL_ARG_BUFFER = 0,
  XPU_KERNEL_ARG_SCALAR = 1
} xpu_kernel_arg_kind;

typedef enum xpu_access {
  XPU_ACCESS_READ = 0,
  XPU_ACCESS_WRITE = 1,
  XPU_ACCESS_READ_WRITE = 2
} xpu_access;

/* Opaque objects, owned by the plugin. */
typedef struct xpu_error xpu_error;
typedef struct xpu_device xpu_device;
typedef struct xpu_buffer xpu_buffer;
typedef struct xpu_stream xpu_stream;
typedef struct xpu_event xpu_event;
typedef struct xpu_kernel xpu_kernel;

/* The head of every extension struct. */
typedef struct xpu_extension_base {
  size_t struct_size;
  uint32_t type;                        /* an xpu_extension_type value */
  const struct xpu_extension_base* next; /* the next extension, or NULL */
} xpu_extension_base;

typedef enum xpu_extension_type {
  XPU_EXTENSION_CAPABILITIES = 1 /* xpu_capabilities_extension */
} xpu_extension_type;

/* A range of device memory. */
typedef struct xpu_buffer_range {
  xpu_buffer* buffer;
  uint64_t offset; /* bytes */
  uint64_t length; /* bytes */
} xpu_buffer_range;

/* ----------------------------------------------------------- negotiation --- */

/* What the host tells the plugin. Allocated by the host; valid during the call. */
typedef struct xpu_host_info {
  size_t struct_size;
  const xpu_extension_base* extensions;
  uint32_t abi_major; /* the host's XPU_PLUGIN_ABI_MAJOR */
  uint32_t abi_minor; /* the highest minor version the host understands */
} xpu_host_info;
#define XPU_HOST_INFO_MIN_SIZE XPU_STRUCT_SIZE(xpu_host_info, abi_minor)

struct xpu_plugin_api;

/* The entry point. Returns the plugin's table, with static lifetime, or NULL if the
 * plugin cannot work with this host at all (the host then reports that the plugin
 * refused its ABI version). Thread-safe; may be called more than once. */
typedef const struct xpu_plugin_api* (*xpu_plugin_get_api_fn)(const xpu_host_info* host);

/* --------------------------------------------------------- argument structs --- */
/* Every function takes one argument struct. "in" fields are set by the host, "out"
 * fields by the plugin. Each starts with struct_size and an extension pointer. */

typedef struct xpu_device_count_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  uint32_t count; /* out */
} xpu_device_count_args;
#define XPU_DEVICE_COUNT_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_device_count_args, count)

typedef struct xpu_device_open_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  uint32_t index;     /* in: 0 .. count-1 */
  xpu_device* device; /* out */
} xpu_device_open_args;
#define XPU_DEVICE_OPEN_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_device_open_args, device)

typedef struct xpu_device_close_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device; /* in */
} xpu_device_close_args;
#define XPU_DEVICE_CLOSE_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_device_close_args, device)

/* Static properties of a device. Strings are valid until the device is closed; name,
 * vendor and driver are never NULL nor empty. kind is an xpu_device_kind and dtype_mask
 * has bits of xpu_dtype values only; memory_bytes > 0 and 1 <= max_allocation <=
 * memory_bytes. A device that names a kernel_format comes with kernel_load,
 * kernel_launch and kernel_destroy, and a power-of-two kernel_arg_alignment. */
typedef struct xpu_device_properties_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device;             /* in */
  const char* name;               /* out: UTF-8, NUL-terminated */
  const char* vendor;             /* out */
  const char* driver;             /* out: driver or firmware version */
  uint32_t kind;                  /* out: xpu_device_kind */
  uint32_t dtype_mask;            /* out: bit (1 << xpu_dtype) per supported dtype */
  uint64_t memory_bytes;          /* out: total memory */
  uint64_t max_allocation;        /* out: largest single allocation */
  uint64_t kernel_arg_alignment;  /* out: byte alignment of kernel buffer arguments */
  uint32_t timeline_events;       /* out: nonzero if waits on events need no host thread */
  uint32_t event_timing;          /* out: nonzero if event_elapsed works */
  const char* kernel_format;      /* out: the native kernel format's name, or NULL */
} xpu_device_properties_args;
#define XPU_DEVICE_PROPERTIES_ARGS_MIN_SIZE \
  XPU_STRUCT_SIZE(xpu_device_properties_args, kernel_format)

typedef struct xpu_memory_info_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device; /* in */
  uint64_t total;     /* out */
  uint64_t free;      /* out */
} xpu_memory_info_args;
#define XPU_MEMORY_INFO_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_memory_info_args, free)

typedef struct xpu_buffer_allocate_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device; /* in */
  uint64_t size;      /* in: 1 .. max_allocation bytes */
  xpu_buffer* buffer; /* out */
} xpu_buffer_allocate_args;
#define XPU_BUFFER_ALLOCATE_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_buffer_allocate_args, buffer)

/* Frees a buffer. The host calls it only when no enqueued work uses the buffer. */
typedef struct xpu_buffer_free_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_buffer* buffer; /* in */
} xpu_buffer_free_args;
#define XPU_BUFFER_FREE_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_buffer_free_args, buffer)

typedef struct xpu_stream_create_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device; /* in */
  xpu_stream* stream; /* out */
} xpu_stream_create_args;
#define XPU_STREAM_CREATE_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_stream_create_args, stream)

/* Used by stream_destroy and stream_synchronize. */
typedef struct xpu_stream_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream; /* in */
} xpu_stream_args;
#define XPU_STREAM_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_stream_args, stream)

typedef struct xpu_stream_query_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream; /* in */
  uint32_t done;      /* out: nonzero when all enqueued work has finished */
} xpu_stream_query_args;
#define XPU_STREAM_QUERY_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_stream_query_args, done)

/* The host validates every range (in bounds, on the stream's device, non-empty,
 * disjoint where required) before calling; plugins may rely on it. */
typedef struct xpu_copy_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream;   /* in */
  xpu_buffer_range src; /* in: device source (device-to-host, device-to-device) */
  xpu_buffer_range dst; /* in: device destination (host-to-device, device-to-device) */
  void* host;           /* in: host memory of `length` bytes for host copies */
  uint64_t length;      /* in: bytes */
} xpu_copy_args;
#define XPU_COPY_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_copy_args, length)

/* A builtin operation. Element counts are range lengths divided by the dtype's size;
 * ranges are element-aligned; operands are identical or disjoint. Arithmetic follows
 * xpu's rules: integers wrap; f16/bf16 computed in f32 and rounded once to nearest
 * even; min/max ignore a NaN operand; casts follow Rust's `as` (float->int truncates
 * and saturates, NaN->0; int->narrower int wraps; ->float rounds once). */
typedef struct xpu_builtin_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream;   /* in */
  uint32_t kind;        /* in: xpu_builtin_kind */
  uint32_t op;          /* in: xpu_binary_op (binary, accumulate) */
  uint32_t dtype;       /* in: xpu_dtype of dst (of the source for cast) */
  uint32_t dst_dtype;   /* in: xpu_dtype of dst for cast */
  xpu_buffer_range dst; /* in */
  xpu_buffer_range a;   /* in: first source (binary, accumulate, scale, cast) */
  xpu_buffer_range b;   /* in: second source (binary) */
  uint8_t scalar[8];    /* in: fill value / scale factor, little-endian, of `dtype` */
} xpu_builtin_args;
#define XPU_BUILTIN_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_builtin_args, scalar)

typedef struct xpu_event_record_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream; /* in */
  xpu_event* event;   /* out */
} xpu_event_record_args;
#define XPU_EVENT_RECORD_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_event_record_args, event)

/* Used by event_destroy. */
typedef struct xpu_event_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_event* event; /* in */
} xpu_event_args;
#define XPU_EVENT_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_event_args, event)

typedef struct xpu_event_query_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_event* event; /* in */
  uint32_t done;    /* out: nonzero once the work before the event has finished */
} xpu_event_query_args;
#define XPU_EVENT_QUERY_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_event_query_args, done)

typedef struct xpu_event_wait_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_event* event;    /* in */
  uint64_t timeout_ns; /* in: UINT64_MAX waits forever; else XPU_ERROR_TIMEOUT */
} xpu_event_wait_args;
#define XPU_EVENT_WAIT_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_event_wait_args, timeout_ns)

typedef struct xpu_event_elapsed_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_event* start;    /* in: complete, same device */
  xpu_event* end;      /* in: complete, same device */
  uint64_t elapsed_ns; /* out */
} xpu_event_elapsed_args;
#define XPU_EVENT_ELAPSED_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_event_elapsed_args, elapsed_ns)

/* Makes later work on `stream` wait for an event of this plugin (any of its devices). */
typedef struct xpu_stream_wait_event_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream; /* in */
  xpu_event* event;   /* in */
} xpu_stream_wait_event_args;
#define XPU_STREAM_WAIT_EVENT_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_stream_wait_event_args, event)

/* An event signalled outside the plugin (another backend's). `wait` blocks until it
 * has completed and returns 0, or returns nonzero if the work before it failed; the
 * plugin calls it on a thread of its own, exactly once, and then calls `release`
 * exactly once (also if the stream is destroyed first). Both are thread-safe. */
typedef struct xpu_external_event {
  void* context;
  int32_t (*wait)(void* context);
  void (*release)(void* context);
} xpu_external_event;

/* Makes later work on `stream` wait until `external.wait` returns. If it reports a
 * failure, the stream's later work fails with XPU_ERROR_ABORTED. Ownership of
 * `external` passes to the plugin whenever the plugin can read this struct: if the call
 * then fails, the plugin calls `release` exactly once and never `wait`. */
typedef struct xpu_stream_wait_external_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream;          /* in */
  xpu_external_event external; /* in: ownership passes to the plugin */
} xpu_stream_wait_external_args;
#define XPU_STREAM_WAIT_EXTERNAL_ARGS_MIN_SIZE \
  XPU_STRUCT_SIZE(xpu_stream_wait_external_args, external)

typedef struct xpu_kernel_load_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device;       /* in */
  const char* format;       /* in: the plugin's native format name */
  const uint8_t* code;      /* in: valid during the call */
  uint64_t code_length;     /* in */
  const char* entry_point;  /* in: NUL-terminated, valid during the call */
  xpu_kernel* kernel;       /* out */
} xpu_kernel_load_args;
#define XPU_KERNEL_LOAD_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_kernel_load_args, kernel)

typedef struct xpu_kernel_destroy_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_kernel* kernel; /* in: no enqueued launch uses it any more */
} xpu_kernel_destroy_args;
#define XPU_KERNEL_DESTROY_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_kernel_destroy_args, kernel)

typedef struct xpu_kernel_arg {
  uint32_t kind;          /* xpu_kernel_arg_kind */
  uint32_t access;        /* xpu_access, for buffers */
  xpu_buffer_range range; /* buffers (length 0: empty range, buffer may be NULL) */
  uint32_t dtype;         /* xpu_dtype, for scalars */
  uint8_t scalar[8];      /* scalars, little-endian */
} xpu_kernel_arg;

typedef struct xpu_kernel_launch_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream;         /* in */
  xpu_kernel* kernel;         /* in */
  uint32_t grid[3];           /* in: workgroups per dimension, each >= 1 */
  uint32_t block[3];          /* in: invocations per workgroup, each >= 1 */
  const xpu_kernel_arg* args; /* in: valid during the call */
  uint64_t arg_count;         /* in */
} xpu_kernel_launch_args;
#define XPU_KERNEL_LAUNCH_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_kernel_launch_args, arg_count)

/* ------------------------------------------------------------- extensions --- */

/* Optional: capabilities beyond the core profile, as "key=value" strings (for example
 * "peer_access=1"), shown in `xpu devices` and in conformance reports. Hung off
 * xpu_plugin_api.extensions. */
typedef struct xpu_capabilities_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device;             /* in */
  const char* const* capabilities; /* out: valid until the device is closed */
  uint64_t count;                 /* out */
} xpu_capabilities_args;
#define XPU_CAPABILITIES_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_capabilities_args, count)

typedef struct xpu_capabilities_extension {
  xpu_extension_base base; /* type = XPU_EXTENSION_CAPABILITIES */
  xpu_error* (*capabilities)(xpu_capabilities_args* args);
} xpu_capabilities_extension;

/* ---------------------------------------------- standard operations (1.1) --- */
/*
 * The standard operations of training (matrix multiply, activations, softmax,
 * cross-entropy, layer norm, embeddings, reductions, optimizer updates, random numbers).
 * Their meaning is the HAL's: `xpu_hal::ops::Op` documents each one (its tensors, in the
 * order below, and its parameters) and the shared rules (computation in at least f32,
 * f64 for f64; one rounding per result; sums in f32 or wider in any order). The
 * conformance profile `training` compares a device with the f64 reference
 * (`xpu_hal::reference::ops`) on every operation and dtype it lists.
 *
 * A device lists what it provides with device_ops; the host sends only those, only on
 * the listed dtypes (the dtype of the first tensor), with op_enqueue. Both are optional
 * (NULL: the device provides no standard operation); a host reads them only from a
 * plugin whose abi_minor is at least 1.
 *
 * What the host guarantees (it has run `xpu_hal::ops::check`): the tensor count and
 * order are the operation's; shapes, dtypes and parameters are valid; every tensor has
 * at least one element, lies in a buffer of the stream's device, and its range spans
 * exactly the bytes its layout addresses (range.offset is element 0, range.length is
 * the span, element-aligned); a written tensor addresses each element once and
 * overlaps no other tensor, except an input it may be identical to where the operation
 * allows in-place use (bias_add, relu, gelu, dropout: y may be x; relu_backward,
 * gelu_backward: dx may be dy) — then both descriptors are equal.
 *
 * What a plugin must do: run the operation asynchronously in stream order, like any
 * work; return enqueue-time refusals at once (UNSUPPORTED for an operation or dtype it
 * does not provide, INVALID_ARGUMENT for a descriptor it cannot use). Check every index
 * (gather, scatter_add) and label (cross_entropy, cross_entropy_backward) before
 * writing anything: one out of range fails the work like any failed work (reported by
 * the next stream_synchronize / stream_query and by later events, code
 * INVALID_ARGUMENT) with a message naming its position and value — "index at position
 * 2 is 8, outside [0, 8)", "label of row 1 is 4, outside [0, 4)" — and nothing is
 * written.
 *
 * Tensors, in order (r = read, w = written, rw = both), and parameters:
 *   MATMUL                  a r, b r, c rw            matmul: c = alpha·op(a)·op(b) + beta·c
 *   BIAS_ADD                x r, bias r, y w
 *   RELU                    x r, y w
 *   RELU_BACKWARD           x r, dy r, dx w
 *   GELU                    x r, y w                  (tanh approximation)
 *   GELU_BACKWARD           x r, dy r, dx w
 *   SOFTMAX                 x r, y w                  (rows: the last dimension)
 *   SOFTMAX_BACKWARD        y r, dy r, dx w
 *   CROSS_ENTROPY           logits r, labels r (i32), loss w
 *   CROSS_ENTROPY_BACKWARD  logits r, labels r (i32), dloss r, dlogits w
 *   LAYER_NORM              x r, gamma r, beta r, y w, mean w, rstd w      layer_norm
 *   LAYER_NORM_BACKWARD     x r, gamma r, mean r, rstd r, dy r, dx w, dgamma w, dbeta w
 *   GATHER                  table r, indices r (i32), out w   (any dtype, bit-exact)
 *   SCATTER_ADD             src r, indices r (i32), table rw
 *   REDUCE                  x r, y w                  reduce
 *   SGD_MOMENTUM            param rw, grad r, velocity rw                  sgd_momentum
 *   ADAMW                   param rw, grad r, m rw, v rw                   adamw
 *   RANDOM                  y w (i32 for bits)        random
 *   DROPOUT                 x r, y w                  dropout
 * Layer norm's mean and rstd are f32 (f64 for f64); every other float tensor has the
 * operation's dtype.
 */
#define XPU_OP_MATMUL 1
#define XPU_OP_BIAS_ADD 2
#define XPU_OP_RELU 3
#define XPU_OP_RELU_BACKWARD 4
#define XPU_OP_GELU 5
#define XPU_OP_GELU_BACKWARD 6
#define XPU_OP_SOFTMAX 7
#define XPU_OP_SOFTMAX_BACKWARD 8
#define XPU_OP_CROSS_ENTROPY 9
#define XPU_OP_CROSS_ENTROPY_BACKWARD 10
#define XPU_OP_LAYER_NORM 11
#define XPU_OP_LAYER_NORM_BACKWARD 12
#define XPU_OP_GATHER 13
#define XPU_OP_SCATTER_ADD 14
#define XPU_OP_REDUCE 15
#define XPU_OP_SGD_MOMENTUM 16
#define XPU_OP_ADAMW 17
#define XPU_OP_RANDOM 18
#define XPU_OP_DROPOUT 19

/* The largest rank of a tensor, and the most tensors an operation has. */
#define XPU_MAX_RANK 4
#define XPU_OP_MAX_TENSORS 8

typedef enum xpu_reduce_op {
  XPU_REDUCE_SUM = 0,
  XPU_REDUCE_MEAN = 1,
  XPU_REDUCE_MAX = 2, /* NaN if any is NaN */
  XPU_REDUCE_MIN = 3  /* NaN if any is NaN */
} xpu_reduce_op;

typedef enum xpu_random_distribution {
  XPU_RANDOM_BITS = 0,    /* Philox's raw 32-bit outputs, as i32 */
  XPU_RANDOM_UNIFORM = 1, /* in [a, b) */
  XPU_RANDOM_NORMAL = 2   /* mean a, standard deviation b */
} xpu_random_distribution;

/* A tensor: element [i0, i1, ...] lies sum(ik * strides[k]) elements after element 0,
 * which is at range.offset. Entries of dims and strides at and beyond `rank` are 0. */
typedef struct xpu_tensor {
  size_t struct_size;
  uint32_t dtype;                 /* xpu_dtype */
  uint32_t rank;                  /* 1 .. XPU_MAX_RANK */
  uint64_t dims[XPU_MAX_RANK];    /* shape */
  uint64_t strides[XPU_MAX_RANK]; /* in elements; 0 broadcasts (inputs only) */
  xpu_buffer_range range;         /* the bytes spanned: offset = element 0 */
} xpu_tensor;
#define XPU_TENSOR_MIN_SIZE XPU_STRUCT_SIZE(xpu_tensor, range)

/* Parameters, by operation (booleans are 0 or 1). */
typedef struct xpu_op_matmul_params {
  uint32_t trans_a; /* a is given as [K, M] */
  uint32_t trans_b; /* b is given as [N, K] */
  float alpha;
  float beta; /* 0: c is not read */
} xpu_op_matmul_params;

typedef struct xpu_op_layer_norm_params {
  float eps;
} xpu_op_layer_norm_params;

typedef struct xpu_op_reduce_params {
  uint32_t op;   /* xpu_reduce_op */
  uint32_t axis; /* the dimension reduced (kept, of size 1, in y) */
} xpu_op_reduce_params;

typedef struct xpu_op_sgd_momentum_params {
  float lr;
  float momentum;
  float weight_decay;
  uint32_t nesterov;
} xpu_op_sgd_momentum_params;

typedef struct xpu_op_adamw_params {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  uint32_t step; /* from 1 */
} xpu_op_adamw_params;

typedef struct xpu_op_random_params {
  uint32_t distribution; /* xpu_random_distribution */
  float a;               /* uniform: low; normal: mean */
  float b;               /* uniform: high; normal: standard deviation */
  uint32_t reserved;     /* 0 */
  uint64_t seed;         /* Philox key */
  uint64_t offset;       /* first Philox counter */
} xpu_op_random_params;

typedef struct xpu_op_dropout_params {
  float p;           /* in [0, 1) */
  uint32_t reserved; /* 0 */
  uint64_t seed;
  uint64_t offset;
} xpu_op_dropout_params;

/* The member named after the operation holds its parameters; the others have none.
 * `reserved` fixes the size at 64 bytes, so later operations fit without growing it. */
typedef union xpu_op_params {
  xpu_op_matmul_params matmul;
  xpu_op_layer_norm_params layer_norm;
  xpu_op_reduce_params reduce;
  xpu_op_sgd_momentum_params sgd_momentum;
  xpu_op_adamw_params adamw;
  xpu_op_random_params random;
  xpu_op_dropout_params dropout;
  uint64_t reserved[8];
} xpu_op_params;

/* One standard operation to enqueue on `stream`. */
typedef struct xpu_op_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_stream* stream;               /* in */
  uint32_t op;                      /* in: XPU_OP_* */
  uint32_t tensor_count;            /* in: the operation's count, at most XPU_OP_MAX_TENSORS */
  const xpu_tensor* const* tensors; /* in: tensor_count descriptors, valid during the call */
  xpu_op_params params;             /* in */
} xpu_op_args;
#define XPU_OP_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_op_args, params)

/* One operation a device provides: bit (1 << xpu_dtype) per dtype of its first tensor. */
typedef struct xpu_op_support {
  uint32_t op;         /* XPU_OP_*; the host ignores numbers it does not know */
  uint32_t dtype_mask; /* the host ignores dtypes the operation is not defined on */
} xpu_op_support;

typedef struct xpu_device_ops_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device;        /* in */
  const xpu_op_support* ops; /* out: `count` entries, valid until the device is closed */
  uint64_t count;            /* out: at most 1024 are read */
} xpu_device_ops_args;
#define XPU_DEVICE_OPS_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_device_ops_args, count)

/* ------------------------------------------------- fault injection (1.2) --- */
/*
 * Testing only: device_inject_fault makes a device fail (or straggle), from now on and
 * for real, the way a real failure would, so that what runs above a plugin (recovery,
 * elastic training, load balancing, conformance cases) can be tested against a device
 * that fails or slows down at a chosen moment. It is optional (NULL: the plugin has no fault injection, and the host reports
 * that to whoever asked); a host reads it only from a plugin whose abi_minor is at
 * least 2. A plugin that does not know the fault number, or cannot inject that fault on
 * this device, returns XPU_ERROR_UNSUPPORTED naming the number and changes nothing.
 *
 * XPU_FAULT_LOST: the device is lost. From the moment the call returns:
 *   - every later call on the device, its buffers, streams, events and kernels fails
 *     with XPU_ERROR_DEVICE_LOST: memory_info, buffer_allocate, stream_create,
 *     kernel_load; every enqueueing function (copies, builtin, op_enqueue,
 *     kernel_launch, event_record, stream_wait_event, stream_wait_external);
 *     stream_synchronize and stream_query; event_query and event_wait. Messages
 *     should say that the fault was injected, so that nobody looks for a real one;
 *   - work already enqueued on its streams and not yet run fails: it becomes the
 *     stream's failure, reported by the next stream_synchronize / stream_query with
 *     XPU_ERROR_DEVICE_LOST, and events recorded after it fail (a stream of another
 *     device waiting on such an event fails its later work with XPU_ERROR_ABORTED, as
 *     for any failed event). stream_synchronize still returns only once no work of
 *     the stream runs any more, so host memory lent to a copy is released safely;
 *   - the device never comes back: the failures above persist until it is closed.
 *     The functions that release objects (buffer_free, stream_destroy, event_destroy,
 *     kernel_destroy, device_close) keep working, so the host can clean up; the
 *     plugin's other devices are not affected.
 *
 * XPU_FAULT_SLOW: the device becomes a straggler. From the moment the call returns,
 * every operation its streams run (copies, builtin, op_enqueue, kernel_launch),
 * including work enqueued earlier that has not started yet, takes delay_ns nanoseconds
 * longer than it otherwise would:
 *   - the delay is spent where the work runs, on the stream's timeline (so events and
 *     event_elapsed see it), never in the enqueueing call, which returns as before;
 *   - results do not change, and neither does anything else about the device;
 *   - a later XPU_FAULT_SLOW replaces the delay; delay_ns 0 ends the slowdown;
 *   - a lost device stays lost: XPU_FAULT_SLOW on it changes nothing.
 * Other faults ignore delay_ns (set it to 0).
 */
typedef enum xpu_fault {
  XPU_FAULT_LOST = 1, /* the device is lost for good */
  XPU_FAULT_SLOW = 2  /* the device is a straggler: delay_ns added to every operation */
} xpu_fault;

typedef struct xpu_device_fault_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device; /* in */
  uint32_t fault;     /* in: XPU_FAULT_* */
  uint64_t delay_ns;  /* in, XPU_FAULT_SLOW: nanoseconds added to every operation from now on (0 ends the slowdown) */
} xpu_device_fault_args;
#define XPU_DEVICE_FAULT_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_device_fault_args, delay_ns)

/* ---------------------------------------------- native collectives (1.3) --- */
/*
 * A plugin whose devices come with a collective library of their own (HCCL, CNCL and
 * BKCL are real examples) offers it through four functions. They are optional and
 * belong together: a host reads them only from a plugin whose abi_minor is at least 3,
 * and uses them only when all four are present. Without them the host runs its own
 * collective algorithms over the plugin's copies and builtins, as for a 1.2 plugin.
 *
 * group_create makes one communicator over open devices of this plugin, rank r on
 * devices[r]:
 *   - device_count is at least 1 and no device appears twice (otherwise
 *     XPU_ERROR_INVALID_ARGUMENT). A plugin that cannot span these devices (a link its
 *     library does not cross, too many ranks) returns XPU_ERROR_UNSUPPORTED saying
 *     why; the host then uses its own algorithms.
 *   - timeout_ns: how long a rank's part of an operation may wait for the other ranks'
 *     parts once it has started (0: the plugin's own default).
 *   - out: group; library, a static string naming the library and its version (for
 *     reports, e.g. "simccl 1.0"); latency_ns and bus_bytes_per_s, the library's cost
 *     figures. The host expects an operation of B bytes per rank on n ranks to take
 *     latency_ns + B x factor / bus_bytes_per_s, with nccl-tests' bus-bandwidth
 *     factors: all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n
 *     of the gathered or scattered buffer (n x B); reduce and broadcast 1. It weighs
 *     them against its own algorithms, and the user can force either choice
 *     (XPU_COLL_ALGO). A plugin that leaves either figure 0 gives none; the host then
 *     prefers the library wherever it implements the operation.
 *   The host destroys every group before closing its devices.
 *
 * group_run enqueues one operation for every rank at once: parts[r] is rank r's part,
 * part_count is the group's size, and the k-th group_run of a group is its k-th
 * operation on every rank. The host calls it for one group from one thread at a time.
 * Each part's stream belongs to rank r's device, and its ranges lie in buffers of that
 * device; a range whose buffer is NULL is absent. count is in elements of dtype for
 * the reductions and in bytes for the others:
 *   XPU_COLLECTIVE_ALL_REDUCE      send, recv: count elements; every recv = op over the
 *                                  ranks' send.
 *   XPU_COLLECTIVE_REDUCE          as all-reduce, but only root's recv is written (other
 *                                  ranks' recv is absent).
 *   XPU_COLLECTIVE_BROADCAST       root's send (count bytes) to every rank's recv; other
 *                                  ranks' send is absent, and root's may be (then its
 *                                  recv holds the data).
 *   XPU_COLLECTIVE_ALL_GATHER      send: count bytes; recv: n x count bytes, block q
 *                                  being rank q's send.
 *   XPU_COLLECTIVE_REDUCE_SCATTER  send: n x count elements; recv: count elements, rank
 *                                  r's being op over the ranks' block r.
 *   XPU_COLLECTIVE_ALL_TO_ALL      send, recv: n x count bytes; block q of rank r's recv
 *                                  is block r of rank q's send.
 * A rank's send and recv are the same range (in place), disjoint, or in place by block:
 * for all-gather, send is block r of rank r's recv; for reduce-scatter, recv is block
 * r of rank r's send (as NCCL allows). Reductions follow
 * the builtin arithmetic (integers wrap, f16/bf16 computed in f32, min/max ignore NaN);
 * XPU_COLLECTIVE_OP_AVG is the sum multiplied by 1/n in the dtype's precision, and for
 * integers the sum multiplied through f64 by the next f64 above 1/n and truncated
 * toward zero. The ranks may be combined in any order, but every rank that receives a
 * result receives the same bits. The host has checked all of the above; a plugin may
 * rely on it (and the SDK checks it again).
 *
 * Asynchrony and failures. group_run enqueues and returns: each part runs on its stream
 * in order with the stream's other work, and holds the stream until its data is in
 * place. Arguments the plugin refuses are returned at once, with nothing enqueued on any
 * stream. A part whose peers' parts do not start within timeout_ns fails its stream's
 * work with XPU_ERROR_TIMEOUT, naming the ranks it waited for; a part that fails (its
 * device was lost) makes every other part of that operation fail with
 * XPU_ERROR_ABORTED, naming the rank. These failures are reported like any stream work's.
 *
 * group_abort releases every part of the group that waits, and fails every part not
 * yet finished, with XPU_ERROR_ABORTED; parts of later group_run calls fail the same
 * way. It returns at once, may be called from any thread at any time (also while
 * another thread is in group_run), and more than once. group_destroy returns once no
 * part of the group runs any more; the host calls it once, after the last group_run.
 */
typedef struct xpu_group xpu_group;

/* ------------------------------- native collectives across processes (1.4) --- */
/*
 * A library whose communicators span processes (as HCCL's, CNCL's and NCCL's do:
 * HcclGetRootInfo and HcclCommInitRootInfo, ncclGetUniqueId and ncclCommInitRank)
 * offers it with one more optional function, group_id, read only from a plugin whose
 * abi_minor is at least 4 and only together with the four functions above.
 *
 * group_id makes a fresh identifier of a group across processes with one device of
 * the plugin: at most XPU_GROUP_ID_MAX bytes, written to id (a buffer of that size)
 * with its length in id_len (at least 1). One process makes it; the host hands the
 * same bytes to every process of the group through its own means (MPI).
 *
 * Every process then calls group_create with its own devices and these fields of
 * xpu_group_create_args, appended in 1.4 (a host leaves id_len 0 for a group within
 * one process, and sets the others only for a plugin that has group_id):
 *   - id, id_len: the identifier;
 *   - size: the ranks in all processes;
 *   - ranks: device_count values, the rank of devices[i] in the whole group, distinct
 *     and below size; every rank of 0 .. size-1 is in exactly one process.
 * group_create is then collective: it returns once every rank of every process has
 * joined, or after timeout_ns (0: the plugin's default) with XPU_ERROR_TIMEOUT and
 * nothing made. A process whose devices the library cannot reach from the others
 * returns XPU_ERROR_UNSUPPORTED at once (the others then time out).
 *
 * group_run on such a group takes this process's parts: part_count is device_count and
 * parts[i] is the part of devices[i]. root and the blocks of all-gather, reduce-scatter
 * and all-to-all are numbered by the ranks of the whole group, and n in the rules above
 * is size. Every process enqueues the same operations in the same order (the k-th
 * group_run is the k-th operation of every rank of every process). A part whose peers
 * in other processes do not take part within timeout_ns fails with XPU_ERROR_TIMEOUT,
 * naming the ranks it waited for; group_abort in one process fails that process's
 * parts, and the others' parts that wait for them time out.
 */
#define XPU_GROUP_ID_MAX 8192

typedef struct xpu_group_id_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* device; /* in: a device of this plugin */
  uint8_t* id;        /* in: XPU_GROUP_ID_MAX bytes; out: the identifier */
  uint64_t id_len;    /* out: its length, 1 to XPU_GROUP_ID_MAX */
} xpu_group_id_args;
#define XPU_GROUP_ID_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_group_id_args, id_len)

typedef enum xpu_collective {
  XPU_COLLECTIVE_ALL_REDUCE = 1,
  XPU_COLLECTIVE_REDUCE = 2,
  XPU_COLLECTIVE_BROADCAST = 3,
  XPU_COLLECTIVE_ALL_GATHER = 4,
  XPU_COLLECTIVE_REDUCE_SCATTER = 5,
  XPU_COLLECTIVE_ALL_TO_ALL = 6
} xpu_collective;

/* Reductions of collectives: the xpu_binary_op values, and the average. */
typedef enum xpu_collective_op {
  XPU_COLLECTIVE_OP_SUM = 0,
  XPU_COLLECTIVE_OP_PROD = 1,
  XPU_COLLECTIVE_OP_MIN = 2,
  XPU_COLLECTIVE_OP_MAX = 3,
  XPU_COLLECTIVE_OP_AVG = 4
} xpu_collective_op;

typedef struct xpu_group_create_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_device* const* devices; /* in: device_count devices of this plugin; rank r on devices[r] */
  uint64_t device_count;      /* in */
  uint64_t timeout_ns;        /* in: how long a part waits for its peers (0: the plugin's default) */
  xpu_group* group;           /* out */
  const char* library;        /* out: static; the library's name and version */
  uint64_t latency_ns;        /* out: cost figure (0: none) */
  uint64_t bus_bytes_per_s;   /* out: cost figure (0: none) */
  /* ABI 1.4: a group across processes (see above); id_len 0 for one within this process. */
  const uint8_t* id;          /* in: the identifier group_id made in one process */
  uint64_t id_len;            /* in: its length (0: a group of this process alone) */
  const uint64_t* ranks;      /* in: device_count ranks, that of devices[i] in the whole group */
  uint64_t size;              /* in: the ranks in all processes */
} xpu_group_create_args;
#define XPU_GROUP_CREATE_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_group_create_args, bus_bytes_per_s)

/* One rank's part of an operation. */
typedef struct xpu_group_part {
  size_t struct_size;
  xpu_stream* stream;    /* in: a stream of the rank's device */
  xpu_buffer_range send; /* in: absent when buffer is NULL */
  xpu_buffer_range recv; /* in: absent when buffer is NULL */
} xpu_group_part;
#define XPU_GROUP_PART_MIN_SIZE XPU_STRUCT_SIZE(xpu_group_part, recv)

typedef struct xpu_group_run_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_group* group;                   /* in */
  uint32_t collective;                /* in: xpu_collective */
  uint32_t dtype;                     /* in: xpu_dtype (reductions; 0 otherwise) */
  uint32_t op;                        /* in: xpu_collective_op (reductions; 0 otherwise) */
  uint32_t root;                      /* in: REDUCE and BROADCAST (0 otherwise) */
  uint64_t count;                     /* in: elements (reductions) or bytes (the others) */
  const xpu_group_part* const* parts; /* in: part_count pointers, parts[r] for rank r */
  uint64_t part_count;                /* in: the group's size */
} xpu_group_run_args;
#define XPU_GROUP_RUN_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_group_run_args, part_count)

typedef struct xpu_group_args {
  size_t struct_size;
  const xpu_extension_base* extensions;
  xpu_group* group; /* in */
} xpu_group_args;
#define XPU_GROUP_ARGS_MIN_SIZE XPU_STRUCT_SIZE(xpu_group_args, group)

/* ------------------------------------------------------------ the table --- */

typedef struct xpu_plugin_api {
  size_t struct_size;                   /* XPU_STRUCT_SIZE of the last member the plugin knows */
  const xpu_extension_base* extensions; /* optional features, or NULL */
  uint32_t abi_major;                   /* the plugin's XPU_PLUGIN_ABI_MAJOR */
  uint32_t abi_minor;                   /* the plugin's XPU_PLUGIN_ABI_MINOR */
  const char* name;    /* REQUIRED: [a-z0-9_-]+, static; devices are plugin.<name>:N */
  const char* version; /* the plugin's own version, static */

  /* Errors (REQUIRED). error_code and error_message never fail; the message is valid
   * until error_destroy. */
  uint32_t (*error_code)(const xpu_error* error);
  const char* (*error_message)(const xpu_error* error);
  void (*error_destroy)(xpu_error* error);

  /* Devices (REQUIRED). */
  xpu_error* (*device_count)(xpu_device_count_args* args);
  xpu_error* (*device_open)(xpu_device_open_args* args);
  xpu_error* (*device_close)(xpu_device_close_args* args);
  xpu_error* (*device_properties)(xpu_device_properties_args* args);
  xpu_error* (*memory_info)(xpu_memory_info_args* args);

  /* Memory (REQUIRED). */
  xpu_error* (*buffer_allocate)(xpu_buffer_allocate_args* args);
  xpu_error* (*buffer_free)(xpu_buffer_free_args* args);

  /* Streams (REQUIRED). */
  xpu_error* (*stream_create)(xpu_stream_create_args* args);
  xpu_error* (*stream_destroy)(xpu_stream_args* args);
  xpu_error* (*stream_synchronize)(xpu_stream_args* args);
  xpu_error* (*stream_query)(xpu_stream_query_args* args);
  xpu_error* (*copy_host_to_device)(xpu_copy_args* args);
  xpu_error* (*copy_device_to_host)(xpu_copy_args* args);
  xpu_error* (*copy_device_to_device)(xpu_copy_args* args);
  xpu_error* (*builtin)(xpu_builtin_args* args);

  /* Events (REQUIRED). */
  xpu_error* (*event_record)(xpu_event_record_args* args);
  xpu_error* (*event_destroy)(xpu_event_args* args);
  xpu_error* (*event_query)(xpu_event_query_args* args);
  xpu_error* (*event_wait)(xpu_event_wait_args* args);
  xpu_error* (*stream_wait_event)(xpu_stream_wait_event_args* args);
  xpu_error* (*stream_wait_external)(xpu_stream_wait_external_args* args);

  /* Optional (NULL when absent). */
  xpu_error* (*event_elapsed)(xpu_event_elapsed_args* args);
  xpu_error* (*kernel_load)(xpu_kernel_load_args* args);
  xpu_error* (*kernel_destroy)(xpu_kernel_destroy_args* args);
  xpu_error* (*kernel_launch)(xpu_kernel_launch_args* args);

  /* ABI 1.1, optional (NULL when absent): the standard operations. A device provides
   * them only when both are present; called once per open device, device_ops. */
  xpu_error* (*device_ops)(xpu_device_ops_args* args);
  xpu_error* (*op_enqueue)(xpu_op_args* args);

  /* ABI 1.2, optional (NULL when absent), for testing only: makes the device fail as a
   * real failure would, from now on (see "fault injection" above for what a lost or slow
   * device must then do). A fault number the plugin does not know is XPU_ERROR_UNSUPPORTED.
   * Absent: the host reports that the plugin has no fault injection. */
  xpu_error* (*device_inject_fault)(xpu_device_fault_args* args);

  /* ABI 1.3, optional and all four or none (see "native collectives" above): the
   * devices' own collective library. Absent: the host runs its own algorithms. */
  xpu_error* (*group_create)(xpu_group_create_args* args);
  xpu_error* (*group_run)(xpu_group_run_args* args);
  xpu_error* (*group_abort)(xpu_group_args* args);
  xpu_error* (*group_destroy)(xpu_group_args* args);

  /* ABI 1.4, optional, and only with the four above (see "native collectives across
   * processes"): an identifier for a group that spans processes. Absent: groups span
   * one process only. */
  xpu_error* (*group_id)(xpu_group_id_args* args);
} xpu_plugin_api;
#define XPU_PLUGIN_API_MIN_SIZE XPU_STRUCT_SIZE(xpu_plugin_api, kernel_launch)

#ifdef __cplusplus
}
#endif

#endif /* XPU_PLUGIN_H */
