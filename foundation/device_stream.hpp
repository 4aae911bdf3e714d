#pragma once
// A CUDA stream (cudaStream_t), opaque so that no public header needs the CUDA SDK.
// nullptr means the legacy default stream.

namespace accel {

using DeviceStream = void*;

}  // namespace accel
