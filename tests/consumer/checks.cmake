# What the consumer projects check about fusedopt::core before they build against it.
get_target_property(fusedopt_features fusedopt::core INTERFACE_COMPILE_FEATURES)
if(NOT "cxx_std_17" IN_LIST fusedopt_features)
  message(FATAL_ERROR "fusedopt::core does not require C++17 "
                      "(INTERFACE_COMPILE_FEATURES: ${fusedopt_features})")
endif()
get_target_property(fusedopt_type fusedopt::core TYPE)
if(FUSEDOPT_EXPECT_TYPE AND NOT fusedopt_type STREQUAL FUSEDOPT_EXPECT_TYPE)
  message(FATAL_ERROR "fusedopt::core is a ${fusedopt_type}, expected ${FUSEDOPT_EXPECT_TYPE}")
endif()
message(STATUS "consumer: fusedopt::core is a ${fusedopt_type} requiring ${fusedopt_features}")
