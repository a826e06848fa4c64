//! The CUDA driver API, loaded at run time (`dlopen("libcuda.so.1")`): the binary links no CUDA
//! library, so the same addon runs on machines without a GPU and uses one where the driver is
//! installed. Only the calls the backend makes are bound.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUdeviceptr = u64;
pub type CUevent = *mut c_void;

pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`: the share of L1 a kernel prefers as
/// shared memory, in percent.
pub const FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: c_int = 9;

/// `CUlaunchAttribute`: an attribute id and its value (a 64-byte union).
#[repr(C)]
pub struct LaunchAttribute {
    pub id: c_int,
    pub pad: [u8; 4],
    pub value: [u64; 8],
}

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut LaunchAttribute,
    pub num_attrs: c_uint,
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: the kernel may start before the one
/// before it in the stream has finished; it waits for it with `griddepcontrol.wait`.
pub const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: c_int = 6;

pub type LaunchKernelEx = unsafe extern "C" fn(*const LaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
const CU_STREAM_NON_BLOCKING: c_uint = 1;
const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

#[link(name = "dl")]
extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}
const RTLD_NOW: c_int = 2;

macro_rules! driver_api {
    ($($field:ident = $sym:literal : fn($($arg:ty),*);)*) => {
        /// The bound entry points of libcuda.
        #[allow(non_snake_case)]
        pub struct Api {
            $(pub $field: unsafe extern "C" fn($($arg),*) -> CUresult,)*
            /// `cuLaunchKernelEx` (drivers for CUDA 11.8 and newer): launches with attributes,
            /// here programmatic dependent launch.
            pub launch_kernel_ex: Option<LaunchKernelEx>,
        }

        impl Api {
            fn load(lib: *mut c_void) -> Result<Api, String> {
                Ok(Api {
                    $($field: {
                        let name = CString::new($sym).unwrap();
                        // SAFETY: dlsym on a handle dlopen returned; the symbol's C signature
                        // is the one declared here (the driver API's documented prototype).
                        let p = unsafe { dlsym(lib, name.as_ptr()) };
                        if p.is_null() {
                            return Err(format!("libcuda has no {}", $sym));
                        }
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CUresult>(p) }
                    },)*
                    launch_kernel_ex: {
                        let name = CString::new("cuLaunchKernelEx").unwrap();
                        // SAFETY: as above; a missing symbol leaves the plain launches.
                        let p = unsafe { dlsym(lib, name.as_ptr()) };
                        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, LaunchKernelEx>(p) })
                    },
                })
            }
        }
    };
}

driver_api! {
    init = "cuInit": fn(c_uint);
    device_get_count = "cuDeviceGetCount": fn(*mut c_int);
    device_get = "cuDeviceGet": fn(*mut CUdevice, c_int);
    device_get_name = "cuDeviceGetName": fn(*mut c_char, c_int, CUdevice);
    device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, CUdevice);
    device_total_mem = "cuDeviceTotalMem_v2": fn(*mut usize, CUdevice);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice);
    ctx_set_current = "cuCtxSetCurrent": fn(CUcontext);
    mem_get_info = "cuMemGetInfo_v2": fn(*mut usize, *mut usize);
    module_load_data = "cuModuleLoadData": fn(*mut CUmodule, *const c_void);
    module_get_function = "cuModuleGetFunction": fn(*mut CUfunction, CUmodule, *const c_char);
    mem_alloc = "cuMemAlloc_v2": fn(*mut CUdeviceptr, usize);
    mem_free = "cuMemFree_v2": fn(CUdeviceptr);
    mem_alloc_host = "cuMemAllocHost_v2": fn(*mut *mut c_void, usize);
    mem_free_host = "cuMemFreeHost": fn(*mut c_void);
    memcpy_htod = "cuMemcpyHtoD_v2": fn(CUdeviceptr, *const c_void, usize);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CUdeviceptr, *const c_void, usize, CUstream);
    memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, CUdeviceptr, usize, CUstream);
    memcpy_dtod_async = "cuMemcpyDtoDAsync_v2": fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    memset_d8 = "cuMemsetD8_v2": fn(CUdeviceptr, u8, usize);
    func_set_attribute = "cuFuncSetAttribute": fn(CUfunction, c_int, c_int);
    launch_kernel = "cuLaunchKernel": fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    stream_create = "cuStreamCreate": fn(*mut CUstream, c_uint);
    stream_synchronize = "cuStreamSynchronize": fn(CUstream);
    stream_begin_capture = "cuStreamBeginCapture_v2": fn(CUstream, c_int);
    stream_end_capture = "cuStreamEndCapture": fn(CUstream, *mut CUgraph);
    graph_instantiate = "cuGraphInstantiateWithFlags": fn(*mut CUgraphExec, CUgraph, u64);
    graph_launch = "cuGraphLaunch": fn(CUgraphExec, CUstream);
    graph_exec_destroy = "cuGraphExecDestroy": fn(CUgraphExec);
    graph_destroy = "cuGraphDestroy": fn(CUgraph);
    get_error_string = "cuGetErrorString": fn(CUresult, *mut *const c_char);
    event_create = "cuEventCreate": fn(*mut CUevent, c_uint);
    event_record = "cuEventRecord": fn(CUevent, CUstream);
    event_synchronize = "cuEventSynchronize": fn(CUevent);
    event_elapsed_time = "cuEventElapsedTime": fn(*mut f32, CUevent, CUevent);
    event_destroy = "cuEventDestroy_v2": fn(CUevent);
}

/// A driver call that failed: the call's name and the driver's code and message.
#[derive(Debug, Clone)]
pub struct CudaError {
    pub call: &'static str,
    pub code: CUresult,
    pub message: String,
}

impl CudaError {
    pub fn out_of_memory(&self) -> bool {
        self.code == CUDA_ERROR_OUT_OF_MEMORY
    }
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {} (CUDA error {})", self.call, self.message, self.code)
    }
}

/// libcuda, loaded once per process (or the reason it is not there).
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let mut last = String::new();
        for name in ["libcuda.so.1", "libcuda.so"] {
            let c = CString::new(name).unwrap();
            // SAFETY: dlopen with a valid C string.
            let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
            if !h.is_null() {
                let api = Api::load(h)?;
                // SAFETY: cuInit takes flags 0.
                let r = unsafe { (api.init)(0) };
                if r != 0 {
                    return Err(format!("cuInit failed with CUDA error {r} (no usable NVIDIA driver or device)"));
                }
                return Ok(api);
            }
            last = name.to_string();
        }
        Err(format!("the NVIDIA driver library ({last}) is not installed"))
    })
    .as_ref()
    .map_err(|e| e.clone())
}

/// Turns a driver result into `Result`.
pub fn check(api: &Api, call: &'static str, r: CUresult) -> Result<(), CudaError> {
    if r == 0 {
        return Ok(());
    }
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
    unsafe { (api.get_error_string)(r, &mut p) };
    let message = if p.is_null() { "unknown error".to_string() } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() };
    Err(CudaError { call, code: r, message })
}

/// The first CUDA device: its name, compute capability and memory.
pub struct DeviceInfo {
    pub device: CUdevice,
    pub name: String,
    pub major: i32,
    pub minor: i32,
    pub total_mem: usize,
    pub sm_count: i32,
}

pub fn first_device(api: &Api) -> Result<DeviceInfo, String> {
    let mut count = 0;
    // SAFETY: plain out-parameter calls on an initialised driver.
    unsafe {
        check(api, "cuDeviceGetCount", (api.device_get_count)(&mut count)).map_err(|e| e.to_string())?;
        if count == 0 {
            return Err("no CUDA device is visible".into());
        }
        let mut dev = 0;
        check(api, "cuDeviceGet", (api.device_get)(&mut dev, 0)).map_err(|e| e.to_string())?;
        let mut name = [0 as c_char; 128];
        check(api, "cuDeviceGetName", (api.device_get_name)(name.as_mut_ptr(), 128, dev)).map_err(|e| e.to_string())?;
        let (mut major, mut minor) = (0, 0);
        check(api, "cuDeviceGetAttribute", (api.device_get_attribute)(&mut major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
            .map_err(|e| e.to_string())?;
        check(api, "cuDeviceGetAttribute", (api.device_get_attribute)(&mut minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
            .map_err(|e| e.to_string())?;
        let mut sm_count = 0;
        check(api, "cuDeviceGetAttribute", (api.device_get_attribute)(&mut sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
            .map_err(|e| e.to_string())?;
        let mut total = 0usize;
        check(api, "cuDeviceTotalMem", (api.device_total_mem)(&mut total, dev)).map_err(|e| e.to_string())?;
        Ok(DeviceInfo { device: dev, name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(), major, minor, total_mem: total, sm_count })
    }
}

pub const STREAM_NON_BLOCKING: c_uint = CU_STREAM_NON_BLOCKING;
pub const CAPTURE_THREAD_LOCAL: c_int = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
