//! ACPI tables for a hardware-reduced x86 platform, built with the `acpi_tables` crate.
//!
//! Layout in the BIOS area at [`ACPI_TABLES_START`]: RSDP first (Linux also finds it there by
//! scanning), then DSDT, FADT, MADT and XSDT, each 16-byte aligned.
//!
//! - FADT: hardware-reduced (no PM1/GPE blocks); power-off through the sleep control register
//!   and reboot through the reset register, both in pvmm's ACPI power I/O block.
//! - MADT: one local APIC per vCPU (UID = APIC id = vCPU index) and the IOAPIC.
//! - DSDT: one processor device (`ACPI0007`) per vCPU with the matching `_UID` and its `_CPC`
//!   (the live capacity registers) and `_PSD`, the platform `_OSC` that grants CPPC, the
//!   Generic Event Device and power button, COM1, and the `\_S5_` sleep type the power device
//!   expects.

use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags, PmProfile};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use pvmm_devices::power::{
    ACPI_POWER_PORT_BASE, RESET_OFFSET, RESET_VALUE, S5_SLEEP_TYPE, SLEEP_CONTROL_OFFSET,
    SLEEP_STATUS_OFFSET,
};
use pvmm_devices::serial::{COM1_IRQ, COM1_PORT_BASE, COM_PORT_LEN};
use pvmm_devices::virtio::mmio::MMIO_WINDOW_LEN;

use pvmm_devices::cppc::{CppcRegister, CPPC_WINDOW_VCPUS};
use pvmm_devices::ged::{GED_MMIO_LEN, POWER_BUTTON_STATUS};

use crate::cppc::{CppcFrequencies, CPPC_HIGHEST_PERF};

use crate::layout::{
    VirtioSlot, ACPI_TABLES_MAX_SIZE, ACPI_TABLES_START, APIC_START, CPPC_MMIO_START, GED_IRQ,
    GED_MMIO_START, IOAPIC_START, MAX_VIRTIO_DEVICES, MMIO_GAP_END, VIRTIO_MMIO_START,
};

/// OEM id written in every table.
pub const OEM_ID: [u8; 6] = *b"PVMM  ";
/// OEM table id written in every table.
const OEM_TABLE_ID: [u8; 8] = *b"PVMMVM  ";
/// OEM revision.
const OEM_REVISION: u32 = 1;
/// DSDT revision 2: 64-bit AML integers.
const DSDT_REVISION: u8 = 2;
/// MADT revision 5 (ACPI 6.x).
const MADT_REVISION: u8 = 5;
/// MADT flags: PCAT_COMPAT, the legacy 8259 pair exists (KVM's in-kernel PIC).
const MADT_PCAT_COMPAT: u32 = 1;
/// MADT structure types and lengths (ACPI 6.5, 5.2.12).
const MADT_LOCAL_APIC: u8 = 0;
const MADT_LOCAL_APIC_LEN: u8 = 8;
const MADT_IOAPIC: u8 = 1;
const MADT_IOAPIC_LEN: u8 = 12;
const MADT_LOCAL_APIC_NMI: u8 = 4;
const MADT_LOCAL_APIC_NMI_LEN: u8 = 6;
/// Local APIC flags: enabled.
const MADT_APIC_ENABLED: u32 = 1;
/// "All processors" in a local APIC NMI structure.
const MADT_ALL_PROCESSORS: u8 = 0xff;
/// NMI on LINT1, active high, edge triggered (MPS INTI flags 0b0101).
const MADT_NMI_FLAGS: u16 = 0x5;
const MADT_NMI_LINT: u8 = 1;
/// The IOAPIC's id. Since the Pentium 4 (xAPIC) IOAPIC and local APIC ids are separate
/// namespaces, and KVM's in-kernel IOAPIC resets its id register to 0.
const IOAPIC_ID: u8 = 0;
/// The most vCPUs the MADT can describe: xAPIC ids are 8 bits and 0xff is the broadcast id.
pub const MAX_VCPUS: u32 = 255;
const _: () = assert!(
    MAX_VCPUS as u64 <= CPPC_WINDOW_VCPUS,
    "the CPPC window holds every vCPU"
);
const _: () = assert!(
    GED_MMIO_START + GED_MMIO_LEN <= MMIO_GAP_END
        && VIRTIO_MMIO_START + MAX_VIRTIO_DEVICES as u64 * MMIO_WINDOW_LEN <= MMIO_GAP_END
        && APIC_START < MMIO_GAP_END
        && IOAPIC_START < MMIO_GAP_END,
    "every register window the tables describe is below 4 GiB"
);
/// FADT IAPC_BOOT_ARCH bit 5: CMOS RTC not present.
const FADT_BOOT_ARCH_NO_CMOS_RTC: u16 = 1 << 5;
/// Tables are 16-byte aligned (RSDP must be, the others by convention).
const TABLE_ALIGN: u64 = 16;
/// Header length of every SDT.
const SDT_HEADER_LEN: u32 = 36;

/// Errors from building the tables.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AcpiError {
    /// The tables outgrew the BIOS area reserved for them.
    #[error("ACPI tables need {0} bytes, more than the reserved area")]
    TooBig(u64),
    /// More vCPUs than the MADT's 8-bit APIC ids allow.
    #[error("{0} vCPUs do not fit the MADT's 8-bit APIC ids")]
    TooManyVcpus(u32),
}

/// One table, where it goes, and its bytes.
#[derive(Debug, Clone)]
pub struct AcpiTable {
    /// Signature, e.g. "DSDT"; "RSDP" for the root pointer.
    pub name: String,
    /// Guest physical address.
    pub addr: u64,
    /// Contents.
    pub bytes: Vec<u8>,
}

/// Every table pvmm gives the guest.
#[derive(Debug, Clone)]
pub struct AcpiTables {
    /// RSDP first, then the others in address order.
    pub tables: Vec<AcpiTable>,
}

impl AcpiTables {
    /// The RSDP's address.
    pub fn rsdp_addr(&self) -> u64 {
        ACPI_TABLES_START
    }
}

/// Writes each table to `dir/<signature>.dat` (lower case), creating `dir`. Returns the files.
pub fn dump_tables(
    tables: &AcpiTables,
    dir: &std::path::Path,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    tables
        .tables
        .iter()
        .map(|t| {
            let path = dir.join(format!("{}.dat", t.name.to_lowercase()));
            std::fs::write(&path, &t.bytes).map(|_| path)
        })
        .collect()
}

fn aml_bytes(item: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    item.to_aml_bytes(&mut out);
    out
}

/// The platform-wide `_OSC` UUID (ACPI 6.5, 6.2.11.2).
const OSC_PLATFORM_UUID: &str = "0811B06E-4A27-44F9-8D60-3CBBC22E7B48";
/// `_OSC` capabilities pvmm grants: CPPC v2 (bit 6) and flexible address space for `_CPC`
/// registers (bit 14); Linux parses `_CPC` only when both are granted.
const OSC_GRANTED: u32 = (1 << 6) | (1 << 14);
/// `_OSC` status bit "unrecognized UUID".
const OSC_UNRECOGNIZED_UUID: u32 = 1 << 2;
/// `_CPC` package: 23 entries, revision 3 (ACPI 6.2+).
const CPC_NUM_ENTRIES: u8 = 23;
const CPC_REVISION: u8 = 3;
/// `_CPC` reference performance, the performance at which the reference counter counts: a
/// full CPU on the guest's scale, since that counter counts the time the vCPU wanted to run.
const CPC_REFERENCE_PERF: u32 = CPPC_HIGHEST_PERF;
/// `_PSD`: 5 entries, revision 0, coordination SW_ANY (0xFD): every vCPU is its own domain,
/// so the value is irrelevant but must be valid.
const PSD_NUM_ENTRIES: u8 = 5;
const PSD_REVISION: u8 = 0;
const PSD_COORD_SW_ANY: u8 = 0xfd;
/// The notification Linux's processor driver maps to "highest performance changed".
pub const NOTIFY_HIGHEST_PERF_CHANGED: u8 = 0x85;
/// Notify value of a power button press (ACPI 6.5, 5.6.6: "Device Object Notification
/// Values", 0x80 on a power button device).
pub const NOTIFY_POWER_BUTTON: u8 = 0x80;
/// Bits of a 64-bit register.
const REG_BITS: u8 = 64;

/// A Generic Register Descriptor (ACPI 6.5, 6.4.3.7). Written here rather than with
/// `acpi_tables::aml::Register`, which encodes its length as 0x12 instead of 0x0C, so that
/// `iasl -d` shows `Register (...)` and not an opaque buffer.
struct GenericRegister(GAS);

/// Generic Register Descriptor: tag byte and the length of what follows it (a GAS).
const GENERIC_REGISTER_TAG: u8 = 0x82;
const GENERIC_REGISTER_LEN: u16 = 12;

impl Aml for GenericRegister {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.byte(GENERIC_REGISTER_TAG);
        sink.word(GENERIC_REGISTER_LEN);
        self.0.to_aml_bytes(sink);
    }
}

/// `ResourceTemplate() { Register(SystemMemory, 64, 0, addr, QWordAccess) }`.
fn cpc_register(addr: u64) -> Vec<u8> {
    let gas = GAS::new(
        AddressSpace::SystemMemory,
        REG_BITS,
        0,
        AccessSize::QwordAccess,
        addr,
    );
    aml_bytes(&aml::ResourceTemplate::new(vec![&GenericRegister(gas)]))
}

/// A register entry the guest must treat as absent: `Register(SystemMemory, 0, 0, 0, 0)`.
fn cpc_null_register() -> Vec<u8> {
    let gas = GAS::new(AddressSpace::SystemMemory, 0, 0, AccessSize::Undefined, 0);
    aml_bytes(&aml::ResourceTemplate::new(vec![&GenericRegister(gas)]))
}

/// Raw AML bytes usable as a package element.
struct RawAml(Vec<u8>);
impl Aml for RawAml {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

/// The `_CPC` package of vCPU `index`: live SystemMemory registers in pvmm's CPPC window for
/// highest, nominal, lowest-nonlinear, lowest, guaranteed and desired performance, both
/// feedback counters and CPPC enable; the reference performance and `freqs` as integers;
/// everything pvmm does not implement is a null register or 0.
pub fn cpc_package(index: u32, freqs: &CppcFrequencies) -> Vec<u8> {
    let reg = |r: CppcRegister| RawAml(cpc_register(r.address(CPPC_MMIO_START, index)));
    let null = || RawAml(cpc_null_register());
    let entries: Vec<Box<dyn Aml>> = vec![
        Box::new(CPC_NUM_ENTRIES),
        Box::new(CPC_REVISION),
        Box::new(reg(CppcRegister::Highest)),
        Box::new(reg(CppcRegister::Nominal)),
        Box::new(reg(CppcRegister::LowestNonlinear)),
        Box::new(reg(CppcRegister::Lowest)),
        Box::new(reg(CppcRegister::Guaranteed)),
        Box::new(reg(CppcRegister::Desired)),
        Box::new(null()), // minimum performance register
        Box::new(null()), // maximum performance register
        Box::new(null()), // performance reduction tolerance register
        Box::new(null()), // time window register
        Box::new(0u8),    // counter wraparound time: 64-bit ns counters do not wrap
        Box::new(reg(CppcRegister::ReferenceCounter)),
        Box::new(reg(CppcRegister::DeliveredCounter)),
        Box::new(null()), // performance limited register
        Box::new(reg(CppcRegister::Enable)),
        Box::new(0u8),    // autonomous selection enable
        Box::new(null()), // autonomous activity window register
        Box::new(null()), // energy performance preference register
        Box::new(CPC_REFERENCE_PERF),
        Box::new(freqs.lowest_mhz),
        Box::new(freqs.nominal_mhz),
    ];
    debug_assert_eq!(entries.len(), CPC_NUM_ENTRIES as usize);
    let refs: Vec<&dyn Aml> = entries.iter().map(|b| b.as_ref()).collect();
    aml_bytes(&aml::Package::new(refs))
}

fn psd_package(index: u32) -> Vec<u8> {
    let one = 1u8;
    let inner = aml::Package::new(vec![
        &PSD_NUM_ENTRIES,
        &PSD_REVISION,
        &index,
        &PSD_COORD_SW_ANY,
        &one,
    ]);
    aml_bytes(&aml::Package::new(vec![&inner]))
}

/// `\_SB._OSC`: grant CPPC v2 and flexible address space, whatever else was asked.
fn osc_method() -> Vec<u8> {
    let cdw1 = aml::Path::new("CDW1");
    let cdw2 = aml::Path::new("CDW2");
    let uuid = aml::Uuid::new(OSC_PLATFORM_UUID);
    let create1 = aml::CreateDWordField::new(&cdw1, &aml::Arg(3), &0u8);
    let create2 = aml::CreateDWordField::new(&cdw2, &aml::Arg(3), &4u8);
    let grant = aml::And::new(&cdw2, &cdw2, &OSC_GRANTED);
    let unknown = aml::Or::new(&cdw1, &cdw1, &OSC_UNRECOGNIZED_UUID);
    let is_platform = aml::Equal::new(&aml::Arg(0), &uuid);
    let if_platform = aml::If::new(&is_platform, vec![&create2, &grant]);
    let otherwise = aml::Else::new(vec![&unknown]);
    let ret = aml::Return::new(&aml::Arg(3));
    aml_bytes(&aml::Method::new(
        "_OSC".into(),
        4,
        false,
        vec![&create1, &if_platform, &otherwise, &ret],
    ))
}

/// `CNFY(n)`: `Notify(<processor n>, 0x85)`, one `If` per vCPU (AML cannot build a device
/// reference from a number).
fn notify_method(vcpus: u32) -> Vec<u8> {
    let names: Vec<aml::Path> = (0..vcpus)
        .map(|i| aml::Path::new(&processor_device_name(i)))
        .collect();
    let notifies: Vec<aml::Notify> = names
        .iter()
        .map(|p| aml::Notify::new(p, &NOTIFY_HIGHEST_PERF_CHANGED))
        .collect();
    let indices: Vec<u32> = (0..vcpus).collect();
    let conds: Vec<aml::Equal> = indices
        .iter()
        .map(|i| aml::Equal::new(&aml::Arg(0), i))
        .collect();
    let ifs: Vec<aml::If> = conds
        .iter()
        .zip(&notifies)
        .map(|(c, n)| aml::If::new(c, vec![n]))
        .collect();
    let body: Vec<&dyn Aml> = ifs.iter().map(|i| i as &dyn Aml).collect();
    aml_bytes(&aml::Method::new("CNFY".into(), 1, true, body))
}

/// `\_SB.PWRB`: the control-method power button (`PNP0C0C`) the GED notifies with 0x80.
fn power_button_device() -> Vec<u8> {
    let hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0C0C"));
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    aml_bytes(&aml::Device::new("PWRB".into(), vec![&hid, &uid]))
}

/// The Generic Event Device: its interrupt, its status register, and `_EVT`, which drains the
/// register: the power-button value notifies `PWRB`, any other value notifies the processor
/// it names (value = vCPU index + 1, 0 = none left).
fn ged_device() -> Vec<u8> {
    let hid = aml::Name::new("_HID".into(), &"ACPI0013");
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let irq = aml::Interrupt::new(true, true, false, false, GED_IRQ);
    let crs = aml::Name::new("_CRS".into(), &aml::ResourceTemplate::new(vec![&irq]));
    let base = low32(GED_MMIO_START);
    let len = low32(GED_MMIO_LEN);
    let region = aml::OpRegion::new("GDST".into(), aml::OpRegionSpace::SystemMemory, &base, &len);
    let field = aml::Field::new(
        "GDST".into(),
        aml::FieldAccessType::DWord,
        aml::FieldLockRule::NoLock,
        aml::FieldUpdateRule::Preserve,
        vec![aml::FieldEntry::Named(*b"GSTA", 32)],
    );
    let gsta = aml::Path::new("GSTA");
    let read = aml::Store::new(&aml::Local(0), &gsta);
    let index = aml::Subtract::new(&aml::Local(1), &aml::Local(0), &aml::ONE);
    let call = aml::MethodCall::new("\\_SB_.CNFY".into(), vec![&aml::Local(1)]);
    let button = aml::Path::new("\\_SB_.PWRB");
    let press = aml::Notify::new(&button, &NOTIFY_POWER_BUTTON);
    let is_button = aml::Equal::new(&aml::Local(0), &POWER_BUTTON_STATUS);
    let if_button = aml::If::new(&is_button, vec![&press]);
    let else_cpu = aml::Else::new(vec![&index, &call]);
    let more = aml::NotEqual::new(&aml::Local(0), &aml::ZERO);
    let drain = aml::While::new(&more, vec![&if_button, &else_cpu, &read]);
    let evt = aml::Method::new("_EVT".into(), 1, true, vec![&read, &drain]);
    aml_bytes(&aml::Device::new(
        "GED0".into(),
        vec![&hid, &uid, &crs, &region, &field, &evt],
    ))
}

/// `\_SB.VRnn`: virtio device `index` (`LNRO0005`, which Linux's `virtio_mmio` driver
/// matches): its register window and its interrupt, edge-triggered and active high as the
/// irqfd that raises it.
fn virtio_device(index: u32, slot: &VirtioSlot) -> Vec<u8> {
    let hid = aml::Name::new("_HID".into(), &"LNRO0005");
    let uid = aml::Name::new("_UID".into(), &index);
    let window = aml::Memory32Fixed::new(true, low32(slot.base), low32(MMIO_WINDOW_LEN));
    let irq = aml::Interrupt::new(true, true, false, false, slot.irq);
    let crs = aml::Name::new(
        "_CRS".into(),
        &aml::ResourceTemplate::new(vec![&window, &irq]),
    );
    let name = format!("VR{index:02X}");
    aml_bytes(&aml::Device::new(
        name.as_str().into(),
        vec![&hid, &uid, &crs],
    ))
}

/// Name of vCPU `index`'s processor device: `C` and three hex digits (AML names are 4 chars).
pub fn processor_device_name(index: u32) -> String {
    format!("C{index:03X}")
}

/// The DSDT body (AML after the header) for `vcpus` processors whose `_CPC` names `freqs`, and
/// the virtio devices in `virtio`.
pub fn dsdt_aml(vcpus: u32, freqs: &CppcFrequencies, virtio: &[VirtioSlot]) -> Vec<u8> {
    let mut body = Vec::new();
    let cpus: Vec<Vec<u8>> = (0..vcpus)
        .map(|i| {
            let hid = aml::Name::new("_HID".into(), &"ACPI0007");
            let uid = aml::Name::new("_UID".into(), &i);
            let cpc = aml::Name::new("_CPC".into(), &RawAml(cpc_package(i, freqs)));
            let psd = aml::Name::new("_PSD".into(), &RawAml(psd_package(i)));
            aml_bytes(&aml::Device::new(
                processor_device_name(i).as_str().into(),
                vec![&hid, &uid, &cpc, &psd],
            ))
        })
        .collect();
    let com_hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0501"));
    let com_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let com_len = u8::try_from(COM_PORT_LEN).unwrap_or(u8::MAX);
    let com_io = aml::IO::new(COM1_PORT_BASE, COM1_PORT_BASE, 1, com_len);
    let com_irq = aml::Interrupt::new(true, true, false, false, COM1_IRQ);
    let com_res = aml::ResourceTemplate::new(vec![&com_io, &com_irq]);
    let com_crs = aml::Name::new("_CRS".into(), &com_res);
    let com1 = aml::Device::new("COM1".into(), vec![&com_hid, &com_uid, &com_crs]);
    let mut sb_children: Vec<u8> = Vec::new();
    for c in &cpus {
        sb_children.extend_from_slice(c);
    }
    com1.to_aml_bytes(&mut sb_children);
    sb_children.extend(osc_method());
    sb_children.extend(notify_method(vcpus));
    sb_children.extend(power_button_device());
    sb_children.extend(ged_device());
    for (i, slot) in (0u32..).zip(virtio) {
        sb_children.extend(virtio_device(i, slot));
    }
    body.extend(aml::Scope::raw("\\_SB_".into(), sb_children));
    let s5_type = S5_SLEEP_TYPE;
    let s5 = aml::Package::new(vec![&s5_type]);
    aml::Name::new("_S5_".into(), &s5).to_aml_bytes(&mut body);
    body
}

fn sdt_with_body(signature: [u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let mut sdt = Sdt::new(
        signature,
        SDT_HEADER_LEN,
        revision,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    sdt.append_slice(body);
    sdt.update_checksum();
    sdt.as_slice().to_vec()
}

/// The MADT body after the SDT header.
pub fn madt_body(vcpus: u32) -> Result<Vec<u8>, AcpiError> {
    if vcpus > MAX_VCPUS {
        return Err(AcpiError::TooManyVcpus(vcpus));
    }
    let mut b = Vec::new();
    b.extend_from_slice(&low32(APIC_START).to_le_bytes());
    b.extend_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    for i in 0..vcpus {
        let id = u8::try_from(i).map_err(|_| AcpiError::TooManyVcpus(vcpus))?;
        b.extend_from_slice(&[MADT_LOCAL_APIC, MADT_LOCAL_APIC_LEN, id, id]);
        b.extend_from_slice(&MADT_APIC_ENABLED.to_le_bytes());
    }
    b.extend_from_slice(&[MADT_IOAPIC, MADT_IOAPIC_LEN, IOAPIC_ID, 0]);
    b.extend_from_slice(&low32(IOAPIC_START).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // GSI base
    b.extend_from_slice(&[
        MADT_LOCAL_APIC_NMI,
        MADT_LOCAL_APIC_NMI_LEN,
        MADT_ALL_PROCESSORS,
    ]);
    b.extend_from_slice(&MADT_NMI_FLAGS.to_le_bytes());
    b.push(MADT_NMI_LINT);
    Ok(b)
}

/// An address or length of pvmm's layout in a 32-bit ACPI field: every one is below 4 GiB
/// (asserted at the top of this module).
fn low32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// The power device's register at `offset` (0 to 2) from its first port.
fn power_register(offset: u64) -> GAS {
    io_register(ACPI_POWER_PORT_BASE.saturating_add(u16::try_from(offset).unwrap_or(u16::MAX)))
}

fn io_register(port: u16) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(port),
    )
}

fn fadt(dsdt_addr: u64) -> Vec<u8> {
    let mut builder = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        // The power button is the control-method device \_SB.PWRB, not a fixed feature.
        .flag(Flags::PwrButton)
        .preferred_pm_profile(PmProfile::EnterpriseServer);
    builder.reset_reg = power_register(RESET_OFFSET);
    builder.reset_value = RESET_VALUE;
    builder.sleep_control_reg = power_register(SLEEP_CONTROL_OFFSET);
    builder.sleep_status_reg = power_register(SLEEP_STATUS_OFFSET);
    // No CMOS RTC: pvmm emulates none, and without this flag Linux's rtc_cmos driver spends
    // seconds probing ports 0x70/0x71 at boot.
    builder.iapc_boot_arch = FADT_BOOT_ARCH_NO_CMOS_RTC.into();
    builder.hypervisor_vendor_identity = u64::from_le_bytes(*b"PVMMPVMM").into();
    aml_bytes(&builder.finalize())
}

fn align(addr: u64) -> u64 {
    addr.div_ceil(TABLE_ALIGN) * TABLE_ALIGN
}

/// Builds every table for `vcpus` vCPUs whose `_CPC` names `freqs` and the virtio devices in
/// `virtio`, with their guest addresses.
pub fn build_tables(
    vcpus: u32,
    freqs: &CppcFrequencies,
    virtio: &[VirtioSlot],
) -> Result<AcpiTables, AcpiError> {
    let mut next = align(ACPI_TABLES_START + Rsdp::len() as u64);
    let mut place = |name: &str, bytes: Vec<u8>| {
        let t = AcpiTable {
            name: name.to_string(),
            addr: next,
            bytes,
        };
        next = align(next + t.bytes.len() as u64);
        t
    };
    let dsdt = place(
        "DSDT",
        sdt_with_body(*b"DSDT", DSDT_REVISION, &dsdt_aml(vcpus, freqs, virtio)),
    );
    let fadt = place("FACP", fadt(dsdt.addr));
    let madt = place(
        "APIC",
        sdt_with_body(*b"APIC", MADT_REVISION, &madt_body(vcpus)?),
    );
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt.addr);
    xsdt.add_entry(madt.addr);
    let xsdt = place("XSDT", aml_bytes(&xsdt));
    let end = xsdt.addr + xsdt.bytes.len() as u64;
    if end - ACPI_TABLES_START > ACPI_TABLES_MAX_SIZE {
        return Err(AcpiError::TooBig(end - ACPI_TABLES_START));
    }
    let rsdp = AcpiTable {
        name: "RSDP".into(),
        addr: ACPI_TABLES_START,
        bytes: aml_bytes(&Rsdp::new(OEM_ID, xsdt.addr)),
    };
    Ok(AcpiTables {
        tables: vec![rsdp, dsdt, fadt, madt, xsdt],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    /// Frequencies of a host with a 2.45 GHz base clock.
    fn freqs() -> CppcFrequencies {
        CppcFrequencies::from_nominal(2450)
    }

    fn table<'a>(t: &'a AcpiTables, name: &str) -> &'a AcpiTable {
        t.tables.iter().find(|x| x.name == name).unwrap()
    }

    #[test]
    fn checksums_and_lengths() {
        for vcpus in [1, 4, 8, 255] {
            let t = build_tables(vcpus, &freqs(), &[]).unwrap();
            for tab in &t.tables {
                if tab.name == "RSDP" {
                    assert_eq!(sum(&tab.bytes[..20]), 0);
                    assert_eq!(sum(&tab.bytes), 0);
                    assert_eq!(tab.bytes.len(), 36);
                    continue;
                }
                assert_eq!(sum(&tab.bytes), 0, "{} checksum", tab.name);
                let len = u32::from_le_bytes(tab.bytes[4..8].try_into().unwrap());
                assert_eq!(len as usize, tab.bytes.len(), "{} length", tab.name);
                assert_eq!(&tab.bytes[..4], tab.name.as_bytes());
                assert_eq!(tab.addr % TABLE_ALIGN, 0);
            }
            // No two tables overlap.
            let mut spans: Vec<(u64, u64)> = t
                .tables
                .iter()
                .map(|x| (x.addr, x.addr + x.bytes.len() as u64))
                .collect();
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0);
            }
        }
    }

    #[test]
    fn pointers_chain_rsdp_xsdt_fadt_dsdt() {
        let t = build_tables(4, &freqs(), &[]).unwrap();
        let rsdp = table(&t, "RSDP");
        let xsdt_addr = u64::from_le_bytes(rsdp.bytes[24..32].try_into().unwrap());
        assert_eq!(xsdt_addr, table(&t, "XSDT").addr);
        let xsdt = &table(&t, "XSDT").bytes;
        let entries: Vec<u64> = xsdt[36..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            entries,
            vec![table(&t, "FACP").addr, table(&t, "APIC").addr]
        );
        let fadt = &table(&t, "FACP").bytes;
        // X_DSDT at offset 140.
        let x_dsdt = u64::from_le_bytes(fadt[140..148].try_into().unwrap());
        assert_eq!(x_dsdt, table(&t, "DSDT").addr);
        // Flags at offset 112: HW_REDUCED_ACPI (bit 20) and RESET_REG_SUP (bit 10).
        let flags = u32::from_le_bytes(fadt[112..116].try_into().unwrap());
        assert_ne!(flags & (1 << 20), 0);
        assert_ne!(flags & (1 << 10), 0);
        // Sleep control register (offset 244) is the power block's first port.
        assert_eq!(fadt[244], 1); // SystemIO
        let port = u64::from_le_bytes(fadt[248..256].try_into().unwrap());
        assert_eq!(port, u64::from(ACPI_POWER_PORT_BASE));
    }

    #[test]
    fn madt_has_one_enabled_lapic_per_vcpu() {
        let body = madt_body(8).unwrap();
        let mut off = 8;
        let mut lapics = vec![];
        let mut ioapics = 0;
        while off < body.len() {
            let (kind, len) = (body[off], body[off + 1] as usize);
            assert!(len > 0);
            if kind == MADT_LOCAL_APIC {
                assert_eq!(body[off + 2], body[off + 3]); // uid == apic id
                lapics.push(body[off + 3]);
            }
            if kind == MADT_IOAPIC {
                ioapics += 1;
            }
            off += len;
        }
        assert_eq!(off, body.len());
        assert_eq!(lapics, (0..8).collect::<Vec<u8>>());
        assert_eq!(ioapics, 1);
        assert_eq!(madt_body(256), Err(AcpiError::TooManyVcpus(256)));
        assert!(madt_body(255).is_ok());
    }

    #[test]
    fn dsdt_declares_each_processor() {
        let aml = dsdt_aml(3, &freqs(), &[]);
        let text = String::from_utf8_lossy(&aml);
        for i in 0..3 {
            assert!(text.contains(&processor_device_name(i)));
        }
        assert_eq!(text.matches("ACPI0007").count(), 3);
        assert_eq!(text.matches("_CPC").count(), 3);
        assert_eq!(text.matches("_PSD").count(), 3);
        assert!(text.contains("_S5_"));
        assert!(text.contains("_OSC"));
        assert!(text.contains("ACPI0013"));
        assert!(text.contains("_EVT"));
    }

    #[test]
    fn cpc_package_has_23_entries_and_live_registers() {
        let p = cpc_package(2, &freqs());
        // PackageOp, PkgLength (2 bytes for this size), NumElements.
        assert_eq!(p[0], 0x12);
        let pkglen_bytes = 1 + (p[1] >> 6) as usize;
        assert_eq!(p[1 + pkglen_bytes], CPC_NUM_ENTRIES);
        // The highest-performance register points at vCPU 2's block in the CPPC window.
        let hi = CppcRegister::Highest
            .address(CPPC_MMIO_START, 2)
            .to_le_bytes();
        assert!(p.windows(8).any(|w| w == hi));
        let ctr = CppcRegister::DeliveredCounter
            .address(CPPC_MMIO_START, 2)
            .to_le_bytes();
        assert!(p.windows(8).any(|w| w == ctr));
        let enable = CppcRegister::Enable
            .address(CPPC_MMIO_START, 2)
            .to_le_bytes();
        assert!(p.windows(8).any(|w| w == enable));
    }

    /// The package ends with the reference performance on the guest's scale and the two
    /// frequencies, in that order (entries 20 to 22).
    #[test]
    fn cpc_package_ends_with_reference_perf_and_frequencies() {
        let f = CppcFrequencies {
            lowest_mhz: 9,
            nominal_mhz: 2450,
        };
        let p = cpc_package(0, &f);
        let mut tail = aml_bytes(&CPC_REFERENCE_PERF);
        tail.extend(aml_bytes(&f.lowest_mhz));
        tail.extend(aml_bytes(&f.nominal_mhz));
        assert!(p.ends_with(&tail), "{p:x?}");
        assert_eq!(CPC_REFERENCE_PERF, 254);
    }
}
