/* A parsed JSON value written again through the one JSON writer (src/common/json_writer.h), so that what
 * the tools print of a file goes through the same string escaper as everything else cachalot writes. */
#ifndef TOOLS_COMMON_JSON_COPY_H
#define TOOLS_COMMON_JSON_COPY_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "json_writer.h"

/* Writes v as the next value of j: members and items in their order (a repeated key stays repeated),
 * strings escaped by cl_json_escape (so a file's invalid UTF-8 comes out as U+FFFD), numbers with the
 * value the file had: an integer below 2^53 in magnitude as that integer, any other number as
 * cl_json_double writes it (17 significant digits, which read back to the same double).
 * false where v nests more containers than the writer takes below j's current depth (CL_JSON_MAX_DEPTH)
 * or holds a value no parser makes (cJSON_Raw, cJSON_Invalid); j is then left mid-value: discard it. */
bool tool_json_copy(cl_json *j, const cJSON *v);

#endif
