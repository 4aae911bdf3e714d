# One precompiled <torch/torch.h>, accel_torch's, shared by every target that links LibTorch.
#
# On the 2-core development VM, parsing LibTorch's umbrella header alone takes ~19 s, and 36
# translation units of executables (tests, test programs, benches, examples, a tool) take
# 25-45 s each with it. Precompiled once (~39 s), it took 1008 s of their compile time to 539.
# GCC uses a PCH only under the code-generation flags and command-line macros it was made
# with: the sharers compile -fPIC as the shared library does, and accel_torch defines no
# accel_torch_EXPORTS (DEFINE_SYMBOL ""), so one PCH serves all (a second one, the
# executables' own, cost the quick start ~25 s of CPU). -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON
# builds without.

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

# Called once, after every add_subdirectory: gives each other target that links LibTorch
# (executables, static and shared libraries) accel_torch's PCH, compiled as accel_torch is.
function(accel_share_torch_pch)
  if(CMAKE_DISABLE_PRECOMPILE_HEADERS OR NOT TARGET accel_torch)
    return()
  endif()
  _accel_targets_under(${PROJECT_SOURCE_DIR} targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY)$" OR target STREQUAL "accel_torch")
      continue()
    endif()
    _accel_links_torch(${target} links_torch)
    if(links_torch)
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF DEFINE_SYMBOL "")
      target_compile_options(${target} PRIVATE -fPIC)
      target_precompile_headers(${target} REUSE_FROM accel_torch)
    endif()
  endforeach()
endfunction()
