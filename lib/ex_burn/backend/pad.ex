if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Pad do
    @moduledoc false

    import ExBurn.Backend.Util
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias ExBurn.Native

    def pad(out, t, pad_value, config) do
      native :pad, out, [t, pad_value, config] do
        d = device_of([t, pad_value])
        put(out, wrap_native(Native.pad(ref(t, d), ref(pad_value, d), config, out.type)))
      end
    end
  end
end
