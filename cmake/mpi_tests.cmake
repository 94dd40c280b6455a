# Multi-process tests of src/dist (tests/dist/mpi), labelled "mpi":
#   dist_mpi_np2, dist_mpi_np4  test_dist_mpi (GoogleTest inside every rank) under
#                               mpirun with 2 and 4 ranks (4 oversubscribe 2 cores)
#   test_dist_fault             starts dist_fault under mpirun with a hung or
#                               killed rank and checks the job ends, naming it
# As root, OpenMPI needs OMPI_ALLOW_RUN_AS_ROOT*. The single-copy mechanism
# (CMA) is off: containers usually forbid the ptrace it needs.
set(NK_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1)

file(GLOB mpi_test_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/dist/mpi/*_mpi.cc)
add_executable(test_dist_mpi ${mpi_test_srcs})
target_link_libraries(test_dist_mpi PRIVATE nk_dist GTest::gtest)
target_include_directories(test_dist_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_compile_definitions(test_dist_mpi PRIVATE NK_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                                 NK_BINARY_DIR="${CMAKE_BINARY_DIR}")
foreach(np 2 4)
  add_test(NAME dist_mpi_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_dist_mpi> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(dist_mpi_np${np} PROPERTIES LABELS mpi TIMEOUT 120
                       ENVIRONMENT "${NK_MPI_ENV}")
endforeach()

add_executable(dist_fault ${CMAKE_SOURCE_DIR}/tests/dist/mpi/fault_main.cc)
target_link_libraries(dist_fault PRIVATE nk_dist)
add_executable(test_dist_fault ${CMAKE_SOURCE_DIR}/tests/dist/mpi/timeout_driver.cc)
target_link_libraries(test_dist_fault PRIVATE nk_core GTest::gtest_main)
target_include_directories(test_dist_fault PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_compile_definitions(test_dist_fault PRIVATE NK_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                                   NK_BINARY_DIR="${CMAKE_BINARY_DIR}"
                                                   NK_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                                                   NK_DIST_FAULT="$<TARGET_FILE:dist_fault>")
add_dependencies(test_dist_fault dist_fault)
gtest_discover_tests(test_dist_fault DISCOVERY_TIMEOUT 60 PROPERTIES LABELS mpi TIMEOUT 60)

# Multi-process tests of src/parallel (tests/parallel/mpi), labelled "mpi":
#   parallel_mpi_np2, parallel_mpi_np4   data parallel against one process
#                                        (GoogleTest inside every rank)
file(GLOB parallel_mpi_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/parallel/mpi/*_mpi.cc)
add_executable(test_parallel_mpi ${parallel_mpi_srcs})
target_link_libraries(test_parallel_mpi PRIVATE nk_train GTest::gtest)
target_include_directories(test_parallel_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_compile_definitions(test_parallel_mpi PRIVATE NK_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                                     NK_BINARY_DIR="${CMAKE_BINARY_DIR}")
foreach(np 2 4)
  add_test(NAME parallel_mpi_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_parallel_mpi> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(parallel_mpi_np${np} PROPERTIES LABELS mpi TIMEOUT 300
                       ENVIRONMENT "${NK_MPI_ENV}")
endforeach()
