if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Pad do
    @moduledoc false

    import ExBurn.Backend.Util

    alias ExBurn.{Backend, Native}

    def pad(out, t, pad_value, config) do
      native :pad, out, [t, pad_value, config] do
        d = Backend.device_of([t, pad_value])
        Backend.put(out, wrap_native(Native.pad(ref(t, d), ref(pad_value, d), config, out.type)))
      end
    end
  end
end
