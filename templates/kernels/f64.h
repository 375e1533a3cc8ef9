// fp64 bindings (DTypeBinding "fp64:fp64:fp64"): loads and stores of double roles, whose
// element math is double (the prelude's double overloads). Pasted after the prelude only
// into the sources of fp64 bindings, so no other binding's source (or cache key) changes.
#ifndef FUSEDOPT_F64_H
#define FUSEDOPT_F64_H

#ifndef FO_GENERATED
#include "prelude.h"
#endif

FO_FN double fo_load(const double* p, long long i) { return p[i]; }
FO_FN void fo_store(double* p, long long i, double v) { p[i] = v; }

#endif  // FUSEDOPT_F64_H
