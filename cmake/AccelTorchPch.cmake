# One precompiled <torch/torch.h> shared by every executable that links LibTorch.
#
# On the 2-core development VM, parsing LibTorch's umbrella header alone takes ~19 s, and 36
# translation units of executables (tests, test programs, benches, examples, a tool) take
# 25-45 s each with it. Precompiled once (~39 s), it took 1008 s of their compile time to 539.
# Executables only: GCC accepts a PCH only under the -fPIE/-fPIC setting it was made with, and
# the libraries include narrower headers. -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON builds without.

# out: TRUE when `target` links the imported `torch` target, directly or through a target it links.
function(_accel_links_torch target out)
  set(${out} FALSE PARENT_SCOPE)
  get_target_property(pending ${target} LINK_LIBRARIES)
  set(seen "")
  while(pending)
    list(POP_FRONT pending current)
    if(current IN_LIST seen OR NOT TARGET ${current})
      continue()
    endif()
    if(current STREQUAL "torch")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    list(APPEND seen ${current})
    # What a linked target passes on to those that link it.
    get_target_property(links ${current} INTERFACE_LINK_LIBRARIES)
    if(links)
      list(APPEND pending ${links})
    endif()
  endwhile()
endfunction()

# The targets defined in `dir` and every directory under it.
function(_accel_targets_under dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    _accel_targets_under(${subdir} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Called once, after every add_subdirectory: gives each LibTorch executable the shared PCH.
function(accel_share_torch_pch)
  if(CMAKE_DISABLE_PRECOMPILE_HEADERS OR NOT TARGET torch)
    return()
  endif()
  # The PCH's owner is an executable so that its PCH is made with the executables' -fPIE.
  set(source ${PROJECT_BINARY_DIR}/accel_torch_pch.cpp)
  file(CONFIGURE OUTPUT ${source} CONTENT "int main() { return 0; }\n")
  add_executable(accel_torch_pch EXCLUDE_FROM_ALL ${source})
  target_link_libraries(accel_torch_pch PRIVATE ${TORCH_LIBRARIES})
  target_compile_features(accel_torch_pch PRIVATE cxx_std_20)
  target_precompile_headers(accel_torch_pch PRIVATE <torch/torch.h>)

  _accel_targets_under(${PROJECT_SOURCE_DIR} targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type STREQUAL "EXECUTABLE" OR target STREQUAL "accel_torch_pch")
      continue()
    endif()
    _accel_links_torch(${target} links_torch)
    if(links_torch)
      target_precompile_headers(${target} REUSE_FROM accel_torch_pch)
    endif()
  endforeach()
endfunction()
