# Run by ctest (see tests/package.cmake) as `cmake -D... -P install_test.cmake`:
#  1. installs the built torchcap into a fresh prefix, WORK_DIR/prefix, and
#     runs the installed command if there is one;
#  2. configures examples/consumer against that prefix only, with the main
#     build's generator, compiler, build type and sanitizer flags;
#  3. builds it (ccache, when the main build uses it, makes this a cache hit
#     after the first run) and runs it, checking what it prints;
#  4. checks that the README shows that program and its output verbatim.
# Every step that fails says which step, with its output.
foreach(var SOURCE_DIR BUILD_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer)

# Every command runs in WORK_DIR: what it writes (the consumer's model.tcg)
# stays there.
function(run step)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "install test: ${step} failed (${result}):\n  ${command}\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

function(fail message)
  message(FATAL_ERROR "install test: ${message}")
endfunction()

# 1. Install. A fresh prefix, so nothing left from an earlier run (a header
#    since removed, say) can make the consumer pass.
file(REMOVE_RECURSE ${prefix} ${consumer_build})
file(MAKE_DIRECTORY ${WORK_DIR})
run("installing torchcap" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

file(GLOB config_files ${prefix}/lib*/cmake/torchcap/torchcapConfig.cmake)
file(GLOB library_files ${prefix}/lib*/libtorchcap.so)
if(NOT EXISTS ${prefix}/include/torchcap/torchcap.h)
  fail("no include/torchcap/torchcap.h in ${prefix}")
endif()
if(NOT config_files)
  fail("no lib/cmake/torchcap/torchcapConfig.cmake in ${prefix}")
endif()
if(NOT library_files)
  fail("no libtorchcap.so in ${prefix}")
endif()

# The command, once src/cli/ defines it, runs from the prefix (its RUNPATH,
# $ORIGIN/../lib, finds the installed library).
if(HAS_COMMAND)
  if(NOT EXISTS ${prefix}/bin/torchcap)
    fail("no bin/torchcap in ${prefix}, though the build has the command")
  endif()
  run("running the installed command" ${prefix}/bin/torchcap --help)
endif()

# The installed library must not point back into the build tree (its build
# RPATH is replaced on install).
find_program(READELF readelf)
if(READELF)
  run("reading the installed library's dynamic section" ${READELF} -d ${library_files})
  string(REGEX MATCHALL "\\((RPATH|RUNPATH)\\)[^\n]*" paths "${step_output}")
  string(FIND "${paths}" "${BUILD_DIR}" at)
  if(NOT at EQUAL -1)
    fail("the installed libtorchcap.so has a run path into the build tree: ${paths}")
  endif()
endif()

# 2. Configure the consumer. Only the prefix is searched for torchcap: the
#    package registry is off, so the build tree cannot be found by accident.
set(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${consumer_build}
  -G ${GENERATOR}
  -DCMAKE_PREFIX_PATH=${prefix}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(BUILD_TYPE)
  list(APPEND configure -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
if(COMPILER_LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${COMPILER_LAUNCHER})
endif()
if(CXX_FLAGS)
  # A sanitized libtorchcap needs a sanitized program (the runtime comes first).
  list(APPEND configure "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${CXX_FLAGS}")
endif()
run("configuring examples/consumer" ${configure})

file(STRINGS ${consumer_build}/CMakeCache.txt found REGEX "^torchcap_DIR:")
string(FIND "${found}" "${prefix}/" at)
if(at EQUAL -1)
  fail("the consumer found torchcap outside the test prefix: ${found}")
endif()

# 3. Build and run.
run("building examples/consumer" ${CMAKE_COMMAND} --build ${consumer_build})
run("running the consumer" ${consumer_build}/consumer)
message("${step_output}")

foreach(expected
    "graph():"
    "%ph_0 : f32[3, 4] [users=1] = placeholder[target=ph_0]"
    "= get_attr[target=0.weight]"
    "= aten::addmm("
    "= aten::relu("
    "max |graph - model| = ")
  string(FIND "${step_output}" "${expected}" at)
  if(at EQUAL -1)
    fail("the consumer's output lacks `${expected}`")
  endif()
endforeach()

# 4. The README's usage section is this program and what it prints, verbatim,
#    so that it cannot drift from the truth.
file(READ ${SOURCE_DIR}/README.md readme)
file(READ ${SOURCE_DIR}/examples/consumer/main.cpp program)
string(FIND "${readme}" "${program}" at)
if(at EQUAL -1)
  fail("README.md does not show examples/consumer/main.cpp verbatim; copy it into the usage section")
endif()
string(FIND "${readme}" "${step_output}" at)
if(at EQUAL -1)
  fail("README.md does not show what examples/consumer prints, verbatim; copy this into the usage section:\n${step_output}")
endif()
