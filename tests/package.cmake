# torchcap as a package: an installed torchcap builds and runs the consumer
# project in examples/consumer.

# The install test: install into a prefix under the build directory, then
# configure, build and run examples/consumer against it with the same
# generator and compiler.
add_test(NAME install_test
  COMMAND ${CMAKE_COMMAND}
    -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DBUILD_DIR=${PROJECT_BINARY_DIR}
    -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_test
    "-DGENERATOR=${CMAKE_GENERATOR}"
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DCOMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
    -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
    -P ${CMAKE_CURRENT_SOURCE_DIR}/install_test.cmake)
set_tests_properties(install_test PROPERTIES TIMEOUT 900)
