# Installing torchcap: `cmake --install <build> --prefix <prefix>` (or `make
# install PREFIX=<prefix>`) puts
#   <prefix>/include/torchcap/*.h                     the public headers
#   <prefix>/<libdir>/libtorchcap.so*                 the library
#   <prefix>/<libdir>/cmake/torchcap/                 the CMake package
#   <prefix>/bin/torchcap                             the command, once it exists
# so that another project needs only
#   find_package(torchcap REQUIRED)
#   target_link_libraries(app PRIVATE torchcap::torchcap)
# (examples/consumer is such a project; tests/install_test.cmake builds it).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TORCHCAP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/torchcap)

# torchcap's headers need C++17; a consumer gets it from the target.
target_compile_features(torchcap PUBLIC cxx_std_17)

# Note [LibTorch in the exported target]
# torchcap links ${TORCH_LIBRARIES} publicly: the imported targets `torch` and
# `torch_library`, and libc10 by this machine's absolute path. An exported
# absolute path would tie the package to this machine's layout, so library
# paths in the link interface are kept for the build tree only; targets are
# exported by name, and the package's find_dependency(Torch) defines them
# again wherever LibTorch is (`torch` brings c10 along, through torch_cpu).
# Run when the top-level CMakeLists.txt has been read, to see every dependency.
function(torchcap_export_link_interface)
  get_target_property(interface torchcap INTERFACE_LINK_LIBRARIES)
  set(exported "")
  foreach(item IN LISTS interface)
    if(IS_ABSOLUTE "${item}")
      list(APPEND exported "$<BUILD_INTERFACE:${item}>")
    else()
      list(APPEND exported "${item}")
    endif()
  endforeach()
  set_property(TARGET torchcap PROPERTY INTERFACE_LINK_LIBRARIES "${exported}")
endfunction()
cmake_language(DEFER CALL torchcap_export_link_interface)

# Note [RPATH of the installed files]
# Installed files must find their libraries without LD_LIBRARY_PATH.
#  - libtorchcap.so needs LibTorch, libdw and libunwind. From Debian packages
#    they sit in the system's library directories and need no RPATH; a LibTorch
#    unpacked elsewhere (e.g. /opt/libtorch) is found through
#    INSTALL_RPATH_USE_LINK_PATH, which records the directories of linked
#    libraries outside the system ones.
#  - The command finds libtorchcap.so beside it, relative to itself
#    ($ORIGIN/../lib), so the prefix can be moved.
# In the build tree CMake's own build RPATH applies; it is replaced on install.
# The linker writes RUNPATH (Debian's default --enable-new-dtags), so
# LD_LIBRARY_PATH still overrides it.
#
# The soname carries major.minor: before 1.0 a minor release may break the ABI.
set_target_properties(torchcap PROPERTIES
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  INSTALL_RPATH_USE_LINK_PATH ON)

install(TARGETS torchcap EXPORT torchcapTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/torchcap
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

install(EXPORT torchcapTargets
  NAMESPACE torchcap::
  DESTINATION ${TORCHCAP_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/torchcapConfig.cmake.in
  ${PROJECT_BINARY_DIR}/torchcapConfig.cmake
  INSTALL_DESTINATION ${TORCHCAP_INSTALL_CMAKEDIR})
# Before 1.0 only the same minor version is compatible (see the soname above).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/torchcapConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/torchcapConfig.cmake
  ${PROJECT_BINARY_DIR}/torchcapConfigVersion.cmake
  DESTINATION ${TORCHCAP_INSTALL_CMAKEDIR})

# Executables installed into <prefix>/bin: the `torchcap` command (target
# torchcap_cli, src/cli/) when it exists. The check is deferred to the end of
# the top-level CMakeLists.txt, so the target may be defined after this file is
# included; another program is one more name in this list.
set(TORCHCAP_INSTALLED_PROGRAMS torchcap_cli)
function(torchcap_install_programs)
  foreach(program IN LISTS TORCHCAP_INSTALLED_PROGRAMS)
    if(NOT TARGET ${program})
      continue()
    endif()
    # Note [RPATH of the installed files]
    set_target_properties(${program} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}"
      INSTALL_RPATH_USE_LINK_PATH ON)
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endforeach()
endfunction()
cmake_language(DEFER CALL torchcap_install_programs)
