# `make sanitize`: torchcap and its tests built with sanitizers
# (-DTORCHCAP_SANITIZE=address,undefined) in their own build directory, and the
# whole suite run through ctest with the runtime options below.
#
# Only torchcap's code (the library, the examples, the tests) is instrumented;
# LibTorch comes from Debian and is not. AddressSanitizer still sees every heap
# block LibTorch allocates (it replaces malloc), and UndefinedBehaviorSanitizer
# checks only instrumented code.
#
# Included before any target is defined: the options apply to every target.
set(TORCHCAP_SANITIZE "" CACHE STRING
  "Sanitizers to build with, as for -fsanitize= (e.g. address,undefined); empty for none")

set(TORCHCAP_SANITIZE_FLAGS "")
if(TORCHCAP_SANITIZE)
  # Frame pointers give ASan's fast unwinder whole stacks through torchcap.
  set(TORCHCAP_SANITIZE_FLAGS -fsanitize=${TORCHCAP_SANITIZE} -fno-omit-frame-pointer)
  add_compile_options(${TORCHCAP_SANITIZE_FLAGS})
  add_link_options(-fsanitize=${TORCHCAP_SANITIZE})
endif()

# Runtime options for every test of the calling directory, set when the
# directory has been read (so tests added after the call are covered too).
#  - Leaks are detected. LibTorch's own allocations that it never frees would
#    be suppressed by name in tests/lsan.supp (none so far); torchcap's own
#    never are.
#  - Any UBSan report fails the test, with a stack trace.
# Python tests need nothing more: the interpreter is not instrumented and does
# not load libtorchcap; the C++ fixtures it starts are instrumented
# executables, which inherit these options.
function(torchcap_sanitize_tests)
  if(NOT TORCHCAP_SANITIZE)
    return()
  endif()
  cmake_language(DEFER CALL _torchcap_sanitize_test_environment)
endfunction()

function(_torchcap_sanitize_test_environment)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(tests)
    set_property(TEST ${tests} APPEND PROPERTY ENVIRONMENT
      "ASAN_OPTIONS=detect_leaks=1:strict_init_order=1:detect_stack_use_after_return=1"
      "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0"
      "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  endif()
endfunction()
