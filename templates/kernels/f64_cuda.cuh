// fp64 bindings on CUDA: the staging of double roles (4 elements, 32 bytes, as two 16-byte
// accesses: PTX has no 32-byte load before sm_100). source.cpp inserts it into the CUDA
// skeleton after its staging types, only for fp64 bindings. The emulator (FO_PTX 0) takes
// the skeleton's portable forms with this fo_vec4.
template <>
struct alignas(32) fo_vec4<double> {
  double v[4];
};
#if FO_PTX
FO_FN fo_vec4<double> fo_load_n(fo_width<4>, const double* p, long long i) {
  fo_vec4<double> r;
  asm volatile("ld.global.L1::no_allocate.v2.f64 {%0, %1}, [%2];"
               : "=d"(r.v[0]), "=d"(r.v[1])
               : "l"(p + i));
  asm volatile("ld.global.L1::no_allocate.v2.f64 {%0, %1}, [%2];"
               : "=d"(r.v[2]), "=d"(r.v[3])
               : "l"(p + i + 2));
  return r;
}
FO_FN fo_vec1<double> fo_load_n(fo_width<1>, const double* p, long long i) {
  fo_vec1<double> r;
  asm volatile("ld.global.L1::no_allocate.f64 %0, [%1];" : "=d"(r.v[0]) : "l"(p + i));
  return r;
}
FO_FN void fo_store_n(double* p, long long i, const fo_vec4<double>& s) {
  asm volatile("st.global.v2.f64 [%0], {%1, %2};" ::"l"(p + i), "d"(s.v[0]), "d"(s.v[1]));
  asm volatile("st.global.v2.f64 [%0], {%1, %2};" ::"l"(p + i + 2), "d"(s.v[2]), "d"(s.v[3]));
}
FO_FN void fo_store_n(double* p, long long i, const fo_vec1<double>& s) {
  asm volatile("st.global.f64 [%0], %1;" ::"l"(p + i), "d"(s.v[0]));
}
#endif
