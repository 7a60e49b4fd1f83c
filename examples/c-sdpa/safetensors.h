/* Reading and writing safetensors files (https://huggingface.co/docs/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON (name -> dtype, shape, data_offsets, plus a
 * "__metadata__" object of strings), then the raw little-endian data.
 *
 * The reader treats the file as untrusted: the header length, every dtype, shape, byte count and
 * offset is checked against the file's size before anything is allocated from it. Values are
 * decoded byte by byte as little-endian, so the code does not depend on the host's byte order. */
#ifndef ATTNSPEC_SAFETENSORS_H
#define ATTNSPEC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_RANK 8
#define ST_MAX_HEADER (16ul * 1024ul * 1024ul)

typedef enum { ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_U8, ST_BOOL, ST_NDTYPES } st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int rank;
    size_t shape[ST_MAX_RANK];
    size_t count;                /* the number of elements */
    const unsigned char *data;   /* count * itemsize bytes, inside the file's buffer */
} st_tensor;

typedef struct {
    unsigned char *buf;          /* the tensor data */
    size_t ntensors;
    st_tensor *tensors;
    size_t nmeta;
    char **meta_keys, **meta_values;
} st_file;

/* 0 on success (free with st_free); -1 with a one-line message in err. */
int st_read(const char *path, st_file *f, char *err, size_t errlen);
void st_free(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta(const st_file *f, const char *key);

const char *st_dtype_name(st_dtype d);          /* "F32", ... */
int st_dtype_parse(const char *name, st_dtype *out);
size_t st_itemsize(st_dtype d);
int st_is_float(st_dtype d);
int st_is_int(st_dtype d);

/* Element i of a tensor as a double (float dtypes, exact) or an int64 (integer and bool). */
double st_get_f64(const st_tensor *t, size_t i);
int64_t st_get_i64(const st_tensor *t, size_t i);

/* IEEE conversions of a double, rounding to nearest, ties to even, in one step: overflow gives
 * infinity, tiny values subnormals or zero, NaN stays NaN (quiet, sign kept). */
uint16_t st_to_f16(double x);
uint16_t st_to_bf16(double x);
uint32_t st_to_f32(double x);
double st_from_f16(uint16_t h);
double st_from_bf16(uint16_t h);
double st_from_f32(uint32_t b);

/* One tensor to write: float data given as doubles, stored in `dtype` (a float dtype). */
typedef struct {
    const char *name;
    st_dtype dtype;
    int rank;
    size_t shape[ST_MAX_RANK];
    const double *values;
} st_out;

/* Write the tensors (sorted by name here) to path; 0 on success, -1 with a message. */
int st_write(const char *path, st_out *tensors, size_t n, char *err, size_t errlen);

#endif
