# libFuzzer harnesses, one per parser (tests/fuzz/<parser>_fuzz.cc), built as
# bin/fuzz_<parser> and run by `make fuzz` (scripts/fuzz.sh). The target
# `fuzzers` builds them all and nothing else (not the tests).
add_custom_target(fuzzers)
file(GLOB fuzz_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/*_fuzz.cc)
foreach(f ${fuzz_srcs})
  get_filename_component(fn ${f} NAME_WE)
  string(REGEX REPLACE "_fuzz$" "" parser ${fn})
  add_executable(fuzz_${parser} ${f})
  target_link_libraries(fuzz_${parser} PRIVATE nk_apps)
  target_include_directories(fuzz_${parser} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_options(fuzz_${parser} PRIVATE -fsanitize=fuzzer)
  set_target_properties(fuzz_${parser} PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                                                  ${CMAKE_BINARY_DIR}/bin)
  add_dependencies(fuzzers fuzz_${parser})
endforeach()
