defmodule Mix.Tasks.ExBurn.Detect do
  @shortdoc "Prints the hardware report: compiled backends, devices and the automatic choice"
  @moduledoc """
  Prints what the native library can use on this machine:

      mix ex_burn.detect

  * the device kinds compiled in (cargo features: `EXBURN_FEATURES=vulkan mix compile`),
  * every enumerated device with the Nx types it supports,
  * what `:auto` picks, and the reason for each kind it passed over,
  * hints when a GPU seems present but is not usable.
  """
  use Mix.Task

  @impl true
  def run(_args) do
    Mix.Task.run("app.config")
    Mix.Task.run("loadpaths")
    Application.ensure_all_started(:logger)

    unless ExBurn.Native.loaded?() do
      Mix.raise("the ExBurn native library is not loaded: #{inspect(ExBurn.Native.load_status())}")
    end

    compiled = ExBurn.Device.compiled_kinds()
    {chosen, reason} = ExBurn.Device.auto()

    Mix.shell().info("""
    ExBurn hardware report
      compiled backends: #{Enum.join(compiled, ", ")}
      devices:
    #{Enum.map_join(ExBurn.devices(), "\n", &device_line/1)}
      :auto picks: #{ExBurn.Device.format(chosen)}
      why: #{String.replace(reason, "; ", "\n           ")}
    """)

    for hint <- hints(compiled, reason), do: Mix.shell().info("  hint: " <> hint)
  end

  defp device_line(%{kind: kind, index: index, name: name, dtypes: dtypes}) do
    types = Enum.map_join(dtypes, " ", &ExBurn.Type.to_string/1)
    "    #{kind}:#{index}  #{name}\n             types: #{types}"
  end

  # A GPU backend compiled in but passed over usually means a driver problem.
  defp hints(compiled, reason) do
    [
      {:vulkan, "vulkan: no device found",
       "Vulkan is compiled in but no adapter was found: install the GPU's Vulkan driver (ICD) and the loader (libvulkan1)."},
      {:vulkan, "software adapter",
       "only a software Vulkan adapter (lavapipe/llvmpipe) is present; it is skipped because the CPU backend is faster and safer."},
      {:cuda, "cuda: no device found",
       "CUDA is compiled in but no device was found: check the NVIDIA driver (libcuda) and CUDA_VISIBLE_DEVICES."},
      {:rocm, "rocm: no device found",
       "ROCm is compiled in but no device was found: check the amdgpu driver and HIP runtime."},
      {:metal, "metal: no device found",
       "Metal is compiled in but no device was found (Metal needs macOS or iOS)."}
    ]
    |> Enum.filter(fn {kind, marker, _} -> kind in compiled and String.contains?(reason, marker) end)
    |> Enum.map(&elem(&1, 2))
    |> then(
      &if(String.contains?(reason, "failed a test upload"),
        do: ["a GPU failed a test upload; see the reason above (driver or memory problem)." | &1],
        else: &1
      )
    )
  end
end
