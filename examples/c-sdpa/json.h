/* A minimal JSON reader (RFC 8259) for the bundle's manifest.json and the safetensors header.
 *
 * It parses a whole document into a tree of `jvalue`s. It trusts nothing: it checks every
 * byte against the grammar, limits the nesting depth, never reads past `len`, and rejects
 * duplicate object keys and strings holding a NUL character. Numbers keep their literal text,
 * so integers (shapes, offsets) are read exactly by `json_int`, never through a double. */
#ifndef ATTNSPEC_JSON_H
#define ATTNSPEC_JSON_H

#include <stddef.h>

typedef enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jvalue {
    jtype type;
    char *str;              /* J_STR: the decoded UTF-8 text; J_NUM: the literal */
    double num;             /* J_NUM: the value as a double */
    size_t len;             /* J_ARR, J_OBJ: the number of items */
    char **keys;            /* J_OBJ: the keys, in document order */
    struct jvalue *items;   /* J_ARR, J_OBJ: the items (values) */
} jvalue;

/* Parse `len` bytes of `text`; 0 on success (free `out` with json_free), -1 with a one-line
 * message in `err` otherwise. */
int json_parse(const char *text, size_t len, jvalue *out, char *err, size_t errlen);
void json_free(jvalue *v);

/* The value of `key` in object `obj`, NULL if `obj` is not an object or lacks the key. */
const jvalue *json_get(const jvalue *obj, const char *key);
/* The string of `key` in `obj`, NULL if absent or not a string. */
const char *json_get_str(const jvalue *obj, const char *key);
/* 0 and the value when `v` is an integer literal (no fraction, no exponent) in [lo, hi]. */
int json_int(const jvalue *v, long long lo, long long hi, long long *out);

#endif
