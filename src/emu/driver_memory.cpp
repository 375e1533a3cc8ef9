// The emulating driver's memory, streams, capture, graphs and events (driver_state.hpp).
#include <cuda.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "emu/driver_state.hpp"

namespace emu = fusedopt::emu;

namespace {
/// A query or a wait on an event runs the work queued before its record: the device has
/// made that progress (a lazy stream never runs ahead of what is waited for), so a query
/// never answers CUDA_ERROR_NOT_READY.
CUresult wait_for_event(emu::Driver& d, CUevent e) {
  if (CUresult r = emu::need_init(d)) return r;
  auto it = d.events.find(e);
  if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  return it->second ? emu::run_pending(d, *it->second) : CUDA_SUCCESS;
}
}  // namespace

extern "C" {

// ---- memory ---------------------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr* p, std::size_t bytes) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemAlloc")) return r;
  const std::uintptr_t a = d.memory.allocate(bytes);
  if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = static_cast<CUdeviceptr>(a);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemFree(CUdeviceptr p) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (p == 0) return CUDA_SUCCESS;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemFree")) return r;
  // Freeing memory waits for the device: no queued work may meet it freed.
  if (CUresult r = emu::wait_all(d)) return r;
  if (!d.memory.free(static_cast<std::uintptr_t>(p))) {
    return emu::report(d, CUDA_ERROR_INVALID_VALUE,
                       "cuMemFree of " + emu::hex(p) + ", not a live allocation (" +
                           d.memory.describe(static_cast<std::uintptr_t>(p), 1) + ")");
  }
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void* src, std::size_t n) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemcpyHtoD")) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyHtoD", dst, n)) return r;
  // As from pageable memory on a GPU: the legacy stream's work first, then the bytes are
  // staged and the call returns, the copy itself still queued on the legacy stream (a
  // launch on a non-blocking stream may run before it lands).
  if (CUresult r = emu::wait_legacy(d)) return r;
  if (n == 0) return CUDA_SUCCESS;
  auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + n);
  return emu::enqueue(d, nullptr, [&d, dst, staged] {
    if (CUresult r = emu::check_range(d, "cuMemcpyHtoD", dst, staged->size())) return r;
    std::memcpy(reinterpret_cast<void*>(dst), staged->data(), staged->size());
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemcpyDtoH(void* dst, CUdeviceptr src, std::size_t n) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::refuse_if_capturing(d, "cuMemcpyDtoH")) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoH", src, n)) return r;
  // Complete on return, after the legacy stream's work (not a non-blocking stream's).
  if (CUresult r = emu::wait_legacy(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoH", src, n)) return r;
  if (n) std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, std::size_t n,
                                              CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyHtoDAsync", dst, n)) return r;
  if (emu::capturing(d, stream)) {
    // A graph's copy reads the host memory when it runs.
    return emu::enqueue(d, stream, [&d, dst, src, n] {
      if (CUresult r = emu::check_range(d, "cuMemcpyHtoDAsync", dst, n)) return r;
      if (n) std::memcpy(reinterpret_cast<void*>(dst), src, n);
      return CUDA_SUCCESS;
    });
  }
  // From pageable memory the driver stages the bytes before it returns.
  auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + n);
  return emu::enqueue(d, stream, [&d, dst, staged] {
    if (CUresult r = emu::check_range(d, "cuMemcpyHtoDAsync", dst, staged->size())) return r;
    if (!staged->empty()) std::memcpy(reinterpret_cast<void*>(dst), staged->data(), staged->size());
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t n,
                                              CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (destination)", dst, n)) return r;
  if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (source)", src, n)) return r;
  return emu::enqueue(d, stream, [&d, dst, src, n] {
    if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (destination)", dst, n)) return r;
    if (CUresult r = emu::check_range(d, "cuMemcpyDtoDAsync (source)", src, n)) return r;
    if (n) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, std::size_t n,
                                             CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = emu::check_range(d, "cuMemsetD32Async", dst, n * 4)) return r;
  return emu::enqueue(d, stream, [&d, dst, v, n] {
    if (CUresult r = emu::check_range(d, "cuMemsetD32Async", dst, n * 4)) return r;
    auto* p = reinterpret_cast<unsigned int*>(dst);
    for (std::size_t i = 0; i < n; ++i) p[i] = v;
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, std::size_t n,
                                            CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (CUresult r = emu::check_range(d, "cuMemsetD8Async", dst, n)) return r;
  return emu::enqueue(d, stream, [&d, dst, v, n] {
    if (CUresult r = emu::check_range(d, "cuMemsetD8Async", dst, n)) return r;
    if (n) std::memset(reinterpret_cast<void*>(dst), v, n);
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute a,
                                                  CUdeviceptr p) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (!d.memory.find(static_cast<std::uintptr_t>(p), 1)) return CUDA_ERROR_INVALID_VALUE;
  if (a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_DEVICE;
  } else if (a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
    *static_cast<int*>(data) = 0;
  } else if (a == CU_POINTER_ATTRIBUTE_CONTEXT) {
    *static_cast<CUcontext*>(data) = emu::kPrimary;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---- streams, capture, graphs ---------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuStreamCreate(CUstream* s, unsigned int flags) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!s || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  auto* rec = new emu::StreamRecord;
  rec->flags = flags;
  d.streams.insert(rec);
  *s = reinterpret_cast<CUstream>(rec);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamDestroy(CUstream s) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* rec = reinterpret_cast<emu::StreamRecord*>(s);
  if (!d.streams.count(rec)) return CUDA_ERROR_INVALID_HANDLE;
  if (rec->capturing && rec->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) --d.global_captures;
  // Its queued work still runs (the real driver finishes it after the call returns).
  const CUresult r = emu::run_pending(d, *rec);
  for (auto& [event, stream] : d.events) {
    if (stream == rec) stream = nullptr;  // that work is done
  }
  d.streams.erase(rec);
  delete rec;
  return r;
}

FO_EMU_API CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!emu::valid_stream(d, s)) return CUDA_ERROR_INVALID_HANDLE;
  if (emu::capturing(d, s) || ((s == nullptr || s == CU_STREAM_LEGACY) && d.global_captures > 0))
    return emu::refuse_if_capturing(d, "cuStreamSynchronize");
  return emu::run_pending(d, emu::record_of(d, s));
}

FO_EMU_API CUresult CUDAAPI cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot be captured
  auto* rec = reinterpret_cast<emu::StreamRecord*>(s);
  if (!d.streams.count(rec)) return CUDA_ERROR_INVALID_HANDLE;
  if (rec->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  rec->capturing = true;
  rec->invalidated = false;
  rec->mode = mode;
  rec->captured.clear();
  if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) ++d.global_captures;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!emu::valid_stream(d, s) || !status) return CUDA_ERROR_INVALID_VALUE;
  const emu::StreamRecord& rec = emu::record_of(d, s);
  *status = !rec.capturing    ? CU_STREAM_CAPTURE_STATUS_NONE
            : rec.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                              : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* g) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* rec = reinterpret_cast<emu::StreamRecord*>(s);
  if (!d.streams.count(rec) || !g) return CUDA_ERROR_INVALID_VALUE;
  if (!rec->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  rec->capturing = false;
  if (rec->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) --d.global_captures;
  std::vector<emu::Operation> ops;
  ops.swap(rec->captured);
  if (rec->invalidated) {
    *g = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  auto* graph = new emu::GraphRecord;
  graph->operations = std::make_shared<const std::vector<emu::Operation>>(std::move(ops));
  d.graphs.insert(graph);
  *g = reinterpret_cast<CUgraph>(graph);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g,
                                                        unsigned long long) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* graph = reinterpret_cast<emu::GraphRecord*>(g);
  if (!d.graphs.count(graph)) return CUDA_ERROR_INVALID_HANDLE;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  auto* exec = new emu::GraphRecord{graph->operations};
  d.graph_execs.insert(exec);
  *e = reinterpret_cast<CUgraphExec>(exec);
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec e, CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto* exec = reinterpret_cast<emu::GraphRecord*>(e);
  if (!d.graph_execs.count(exec)) return CUDA_ERROR_INVALID_HANDLE;
  auto ops = exec->operations;
  return emu::enqueue(d, stream, [ops] {
    for (const emu::Operation& op : *ops) {
      if (CUresult r = op()) return r;
    }
    return CUDA_SUCCESS;
  });
}

FO_EMU_API CUresult CUDAAPI cuGraphDestroy(CUgraph g) {
  FO_LOCK;
  return emu::destroy(d.graphs, reinterpret_cast<emu::GraphRecord*>(g));
}

FO_EMU_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) {
  FO_LOCK;
  return emu::destroy(d.graph_execs, reinterpret_cast<emu::GraphRecord*>(e));
}

// ---- events ---------------------------------------------------------------------------------

FO_EMU_API CUresult CUDAAPI cuEventCreate(CUevent* e, unsigned int) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  *e = reinterpret_cast<CUevent>(new char);
  d.events[*e] = nullptr;
  return CUDA_SUCCESS;
}

FO_EMU_API CUresult CUDAAPI cuEventRecord(CUevent e, CUstream stream) {
  FO_LOCK;
  if (CUresult r = emu::need_context(d)) return r;
  auto it = d.events.find(e);
  if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!emu::valid_stream(d, stream)) return CUDA_ERROR_INVALID_HANDLE;
  it->second = emu::capturing(d, stream) ? nullptr : &emu::record_of(d, stream);
  return emu::enqueue(d, stream, [] { return CUDA_SUCCESS; });
}

FO_EMU_API CUresult CUDAAPI cuEventQuery(CUevent e) {
  FO_LOCK;
  return wait_for_event(d, e);
}

FO_EMU_API CUresult CUDAAPI cuEventSynchronize(CUevent e) {
  FO_LOCK;
  return wait_for_event(d, e);
}

FO_EMU_API CUresult CUDAAPI cuEventDestroy(CUevent e) {
  FO_LOCK;
  if (CUresult r = emu::need_init(d)) return r;
  if (!d.events.erase(e)) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<char*>(e);
  return CUDA_SUCCESS;
}

}  // extern "C"
