/* The copier of json_copy.h. */
#include "json_copy.h"

#include <math.h>
#include <stdint.h>

/* 2^53: below it every integer is exactly a double (and an int64_t), so the integer's digits are the
 * file's number; beyond it the parser may have rounded the file's integer already, and cl_json_double
 * writes the double it has (17 significant digits read back to it). */
static const double exact_int_limit = 9007199254740992.0;

static void copy_number(cl_json *j, double d) {
  /* -0 has no int64_t: cl_json_double keeps its sign ("-0") */
  if (d > -exact_int_limit && d < exact_int_limit && d == (double)(int64_t)d && !(d == 0 && signbit(d)))
    cl_json_int(j, (int64_t)d);
  else
    cl_json_double(j, d);
}

bool tool_json_copy(cl_json *j, const cJSON *v) {
  if (cJSON_IsNull(v)) {
    cl_json_null(j);
  } else if (cJSON_IsBool(v)) {
    cl_json_bool(j, cJSON_IsTrue(v));
  } else if (cJSON_IsNumber(v)) {
    copy_number(j, v->valuedouble);
  } else if (cJSON_IsString(v)) {
    cl_json_string(j, v->valuestring);
  } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
    /* The writer turns a deeper container into an allocation failure; refused here, the caller can
     * say what went wrong. The recursion is bounded by the same depth. */
    if (j->depth + 1 >= CL_JSON_MAX_DEPTH)
      return false;
    const bool object = cJSON_IsObject(v);
    if (object)
      cl_json_begin_object(j);
    else
      cl_json_begin_array(j);
    for (const cJSON *c = v->child; c != NULL; c = c->next) {
      if (object)
        cl_json_key(j, c->string);
      if (!tool_json_copy(j, c))
        return false;
    }
    if (object)
      cl_json_end_object(j);
    else
      cl_json_end_array(j);
  } else {
    return false;
  }
  return true;
}
