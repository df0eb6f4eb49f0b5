# Run by ctest as `cmake -D... -P python_install_test.cmake`: installs the
# build into a fresh prefix and checks that /usr/bin/python3, with only that
# prefix's package directory on PYTHONPATH (as docs/python.md says), imports the
# installed torchcap, compiled part included, and traces with it.
foreach(var BUILD_DIR WORK_DIR PYTHON PACKAGE_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "python_install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${prefix})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "python install test: installing failed:\n${out}\n${err}")
endif()
# The types ship with the package (PEP 561): type checkers read them there.
foreach(typed py.typed _C.pyi)
  if(NOT EXISTS ${prefix}/${PACKAGE_DIR}/torchcap/${typed})
    message(FATAL_ERROR "python install test: torchcap/${typed} is not installed")
  endif()
endforeach()

set(check [=[
import torch, torchcap, torchcap._C, sys
assert torchcap.__file__.startswith(sys.argv[1]), torchcap.__file__
gm = torchcap.trace(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
print(sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
]=])
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${prefix}/${PACKAGE_DIR}
    ${PYTHON} -c "${check}" ${prefix}/${PACKAGE_DIR}
  WORKING_DIRECTORY ${WORK_DIR}
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0 OR NOT out MATCHES "aten.addmm.default")
  message(FATAL_ERROR "python install test: the installed package does not trace:\n${out}\n${err}")
endif()
